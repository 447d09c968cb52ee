"""DESIGN.md stays a design document: its module map names every module, and it is short.

The map is the table of the section "## Modules", whose rows start with "| `audit/...`":
one row per module of the package (each ``.py`` file but ``__init__.py``, by its path),
and a row may also name a subpackage by its folder (``audit/testproc/``). Other tables
(the places that know a vLLM release) may name other files under ``audit/``. The dated
measurements and the ideas tried and dropped live in ``docs/design/`` and
``docs/logs/``, not in DESIGN.md.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "DESIGN.md"
PACKAGE = ROOT / "audit"
MAX_LINES = 700
MAP_HEADING = "## Modules"
ROW = re.compile(r"^\| `(audit/[^`]*)` \|")


def package_modules() -> set[str]:
    """Every module of the package, as its path from the repository's root."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py"
    }


def module_map() -> list[str]:
    """The lines of DESIGN.md's section "## Modules", up to the next section."""
    lines = DESIGN.read_text().splitlines()
    assert MAP_HEADING in lines, f"DESIGN.md has no section {MAP_HEADING!r}"
    start = lines.index(MAP_HEADING) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def mapped_names() -> list[str]:
    """The paths the module map's rows name, in the order of the table."""
    return [m.group(1) for line in module_map() if (m := ROW.match(line))]


def test_the_module_map_lists_every_module_of_the_package() -> None:
    missing = sorted(package_modules() - set(mapped_names()))
    assert not missing, f"DESIGN.md's module map has no row for: {', '.join(missing)}"


def test_the_module_map_names_only_modules_that_exist() -> None:
    unknown = []
    for name in mapped_names():
        path = ROOT / name
        if name.endswith("/"):  # a subpackage, by its folder
            if not (path / "__init__.py").is_file():
                unknown.append(name)
        elif not (name.endswith(".py") and path.is_file()):
            unknown.append(name)
    assert not unknown, f"DESIGN.md's module map names what does not exist: {', '.join(unknown)}"


def test_the_module_map_names_each_module_once() -> None:
    names = mapped_names()
    repeated = sorted({name for name in names if names.count(name) > 1})
    assert not repeated, f"DESIGN.md's module map has more than one row for: {', '.join(repeated)}"


def test_the_design_document_is_at_most_700_lines() -> None:
    count = len(DESIGN.read_text().splitlines())
    assert count <= MAX_LINES, (
        f"DESIGN.md has {count} lines, over {MAX_LINES}: move measurements and dated notes "
        "to docs/design/ or docs/logs/ and link to them"
    )

"""The upstream series: what fence-audit proposes to vLLM, read from
``docs/upstream/series.toml``.

Per open finding (an id of ``docs/findings.toml``), a *fix*: its regression test (a
node id in one of the vLLM-idiom test files of ``docs/upstream/tests/``, which drop
into vLLM's offloading connector test folder) and its patch (``docs/upstream/patches/``,
a ``git diff`` of vLLM's source as released: one pull request each). The fixes are a
series, in the file's order; where two fixes change the same lines, the later one also
has a ``rebased`` patch, written on top of the fixes before it, which the series
applies instead. Beside them, the *gap tests*: vLLM-idiom test files
that close what vLLM's own fence tests miss, with no finding of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit.core.errors import ConfigError
from audit.core.inputs import known_keys, read_toml
from audit.setup.values import expect, release_version, string, strings

SERIES_FILE = "series.toml"
_TOP = {"release", "fix", "gaps"}
_FIX = {"finding", "test", "patch", "rebased", "touches"}
_GAPS = {"tests"}


@dataclass(frozen=True, slots=True)
class Fix:
    finding: str  # an id of docs/findings.toml
    test: str  # "test_file.py::test_name" (or "test_file.py": its every test), in tests/
    patch: Path  # the fix, a `git diff` of vLLM's source as released (its pull request)
    touches: tuple[str, ...]  # "vllm/...py: Class.function", what the patch changes
    # the same fix rebased on the fixes before it in the series, where ``patch`` no
    # longer applies there (two fixes of one function): what the series applies
    rebased: Path | None = None

    @property
    def in_series(self) -> Path:
        """The patch the series applies, in order, on top of the fixes before it."""
        return self.rebased or self.patch

    @property
    def test_file(self) -> str:
        return self.test.split("::", 1)[0]


@dataclass(frozen=True, slots=True)
class Series:
    root: Path  # docs/upstream
    release: str  # the release the patches are written against (the default to check)
    fixes: tuple[Fix, ...]
    gap_tests: tuple[str, ...]  # file names in tests/

    @property
    def tests_dir(self) -> Path:
        return self.root / "tests"

    def test_files(self) -> list[Path]:
        """Every vLLM-idiom test file of the series, each once, in order."""
        names = dict.fromkeys([*(f.test_file for f in self.fixes), *self.gap_tests])
        return [self.tests_dir / name for name in names]

    def fix(self, finding: str) -> Fix:
        for fix in self.fixes:
            if fix.finding == finding:
                return fix
        raise ConfigError(
            f"the upstream series has no fix for {finding!r}",
            details={
                "file": str(self.root / SERIES_FILE),
                "known": ", ".join(f.finding for f in self.fixes),
                "next": "name a finding the series fixes",
            },
        )


def load_series(root: Path, known_findings: set[str] | None = None) -> Series:
    """Read ``root/series.toml``; every file it names must exist, every finding be known."""
    path = root / SERIES_FILE
    source = str(path)
    table = read_toml(path, "the upstream series")
    known_keys(table, _TOP, "the upstream series", config=source)
    release = release_version(string(table, "release", source), f"release ({source})")
    fixes = []
    for index, entry in enumerate(expect(table.get("fix", []), list, "[[fix]]", source)):
        where = f"fix[{index}]"
        expect(entry, dict, where, source)
        known_keys(entry, _FIX, where, config=source)
        fix = Fix(
            finding=string(entry, "finding", source, where),
            test=string(entry, "test", source, where),
            patch=root / string(entry, "patch", source, where),
            touches=strings(entry, "touches", source, where),
            rebased=root / entry["rebased"] if "rebased" in entry else None,
        )
        _check_fix(fix, root, where, source, known_findings)
        fixes.append(fix)
    seen = [f.finding for f in fixes]
    twice = sorted({f for f in seen if seen.count(f) > 1})
    if twice:
        raise ConfigError(
            f"the upstream series fixes {twice[0]!r} twice",
            details={"file": source, "next": "keep one [[fix]] per finding"},
        )
    gaps: dict[str, Any] = expect(table.get("gaps", {}), dict, "[gaps]", source)
    known_keys(gaps, _GAPS, "[gaps]", config=source)
    gap_tests = strings(gaps, "tests", source, "gaps")
    for name in gap_tests:
        _exists(root / "tests" / name, "gaps.tests", source)
    return Series(root=root, release=release, fixes=tuple(fixes), gap_tests=gap_tests)


def _check_fix(fix: Fix, root: Path, where: str, source: str, known: set[str] | None) -> None:
    if known is not None and fix.finding not in known:
        raise ConfigError(
            f"{where}.finding {fix.finding!r} is not a finding of docs/findings.toml",
            details={"file": source, "next": "use the finding's id as the registry spells it"},
        )
    if not fix.test_file.endswith(".py"):
        raise ConfigError(
            f"{where}.test must name a test file or a test, FILE.py[::TEST], not {fix.test!r}",
            details={"file": source, "next": "write the test's node id in its file"},
        )
    _exists(root / "tests" / fix.test_file, f"{where}.test", source)
    _exists(fix.patch, f"{where}.patch", source)
    if fix.rebased is not None:
        _exists(fix.rebased, f"{where}.rebased", source)


def _exists(path: Path, key: str, source: str) -> None:
    if not path.is_file():
        raise ConfigError(
            f"{key} names {path.name}, which is not a file",
            details={
                "file": source,
                "looked in": str(path),
                "next": "add the file, or fix the name",
            },
        )

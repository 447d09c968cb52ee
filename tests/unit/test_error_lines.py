"""Every error reads as the README promises: what failed, where (in parentheses), then
``next:`` what to do. The tables below hold bad configurations, catalogue entries,
equivalents and findings files; each must be refused with such a line, the place in a
detail rather than in the summary. A static check keeps every error the package raises
to a ``next`` detail."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from audit.cli import main
from audit.core import errors
from audit.core.errors import AuditError, ConfigError, ExitCode
from audit.mutation.equivalents import load_equivalents
from audit.pipeline import load_entries
from audit.setup.config import load_config
from audit.setup.findings import load_findings

ROOT = Path(__file__).parents[2]
RESULTS = Path(__file__).parent / "data" / "results.json"


def assert_what_where_next(error: AuditError, place: str) -> None:
    """``error`` renders as one line ending in its ``next`` detail, names ``place`` in a
    detail (the parenthesised where), and keeps ``place`` out of its summary."""
    line = error.render()
    assert "\n" not in line
    assert error.details.get("next", "").strip(), f"no next: {line}"
    assert line.endswith(f"; next: {error.details['next']}"), line
    where = {key: value for key, value in error.details.items() if key != "next"}
    assert where, f"no where: {line}"
    first = next(iter(where))
    assert line.startswith(f"fence-audit: {error.summary} ({first}: "), line
    assert any(place in value for value in where.values()), f"{place} not named: {line}"
    assert place not in error.summary, f"{place} in the summary: {line}"


# --- the configuration ------------------------------------------------------------

BAD_CONFIGS = {
    "fail-under true": "[tool.fence-audit.gate]\nfail-under = true",
    "fail-under a string": '[tool.fence-audit.gate]\nfail-under = "99"',
    "fail-under above 100": "[tool.fence-audit.gate]\nfail-under = 101",
    "region threshold a string": '[tool.fence-audit.gate]\nregions = { population = "x" }',
    "unknown gate key": "[tool.fence-audit.gate]\nx = 1",
    "unknown top key": '[tool.fence-audit]\nvllm_version = "0.33.0"',
    "empty index-url": '[tool.fence-audit]\nindex-url = ""',
    "ftp index-url": '[tool.fence-audit]\nindex-url = "ftp://mirror"',
    "empty reports": '[tool.fence-audit]\nreports = ""',
    "empty target": '[tool.fence-audit]\ntarget = ""',
    "version not a release": '[tool.fence-audit]\nvllm-version = "abc"',
    "version a number": "[tool.fence-audit]\nvllm-version = 0.33",
    "no regions": "[tool.fence-audit.regions]",
    "unknown region key": '[tool.fence-audit.regions.foo]\nx = 1\nselect = [{ function = "f" }]',
    "region named as a path": '[tool.fence-audit.regions."../../victim"]\n'
    'select = [{ function = "f" }]',
    "region selects nothing": '[tool.fence-audit.regions.r]\ndescription = "d"',
    "bad part": '[[tool.fence-audit.regions.r.select]]\nfunction = "f"\n'
    'statements = [{ match = "x", part = "body" }]',
    "bad since": '[[tool.fence-audit.regions.r.select]]\nfunction = "f"\nsince = "soon"',
    "empty alternatives": "[[tool.fence-audit.regions.r.select]]\nfunction = []",
    "suite path without root": '[tool.fence-audit.suite]\npaths = ["tests"]',
    "suite path leaving root": '[tool.fence-audit.suite]\npaths = ["project:../x"]',
    "deep seconds 0": "[tool.fence-audit.deep]\nseconds = 0",
    "deep seconds infinite": "[tool.fence-audit.deep]\nseconds = inf",
    "deep seconds 400 digits": "[tool.fence-audit.deep]\nseconds = 1" + "0" * 400,
    "missing catalogue": '[tool.fence-audit]\ncatalogue = "nowhere"',
}


@pytest.mark.parametrize("body", BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_a_bad_configuration_says_where_and_what_next(tmp_path: Path, body: str) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text(body + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.exit_code == ExitCode.USAGE
    assert_what_where_next(info.value, str(path))


def test_a_version_that_is_no_release_names_who_set_it(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.fence-audit]\nvllm-version = "abc"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.render() == (
        "fence-audit: the vLLM version 'abc' is not a release "
        f"(set by: [tool.fence-audit] vllm-version in {path}); "
        "next: give a release as PyPI lists it, such as 0.33.0"
    )


@pytest.mark.parametrize("name", ["fail-under true", "unknown gate key", "no regions"])
def test_the_command_line_prints_the_same_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text(BAD_CONFIGS[name] + "\n")
    assert main(["gate", "--config", str(path), "--results", str(RESULTS)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"(config: {path}" in err
    assert "; next: " in err


# --- the catalogue ------------------------------------------------------------------

ENTRY = {
    "format": "1",
    "id": '"e"',
    "region": '"flush"',
    "title": '"t"',
    "bug": '"b"',
    "invariant": '"I1"',
    "symptom": '"s"',
    "expected": '"vllm"',
}
CHANGE = {"function": '"C.f"', "statement": '"x = 1"', "action": '"delete"'}


def entry_text(entry: dict[str, str | None], changes: list[dict[str, str | None]]) -> str:
    """A catalogue entry: ``ENTRY`` and ``CHANGE`` with some keys changed (None: left out)."""
    lines = [f"{k} = {v}" for k, v in (ENTRY | entry).items() if v is not None]
    for change in changes:
        lines.append("[[change]]")
        lines += [f"{k} = {v}" for k, v in (CHANGE | change).items() if v is not None]
    return "\n".join(lines) + "\n"


BAD_ENTRIES: dict[str, tuple[dict[str, str | None], list[dict[str, str | None]]]] = {
    "format 9": ({"format": "9"}, [{}]),
    "expected zzz": ({"expected": '"zzz"'}, [{}]),
    "no change": ({}, []),
    "empty id": ({"id": '""'}, [{}]),
    "id not the file name": ({"id": '"other"'}, [{}]),
    "unknown key": ({"colour": '"red"'}, [{}]),
    "region not configured": ({"region": '"nowhere"'}, [{}]),
    "bad since": ({"since": '"soon"'}, [{}]),
    "carried-when not a table": ({"carried-when": "1"}, [{}]),
    "action explode": ({}, [{"action": '"explode"'}]),
    "unknown change key": ({}, [{"colour": '"red"'}]),
    "occurrence 0": ({}, [{"occurrence": "0"}]),
    "occurrence -1": ({}, [{"occurrence": "-1"}]),
    "occurrence true": ({}, [{"occurrence": "true"}]),
    "occurrence a string": ({}, [{"occurrence": '"2"'}]),
    "edit without new": ({}, [{"action": '"edit"', "old": '"1"'}]),
    "empty anchor list": ({}, [{"statement": "[]"}]),
    "two functions": ({}, [{}, {"function": '"C.g"'}]),
}


def catalogue_config(tmp_path: Path) -> Path:
    (tmp_path / "catalogue").mkdir()
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.fence-audit]\ncatalogue = "catalogue"\n')
    return path


@pytest.mark.parametrize(("entry", "changes"), BAD_ENTRIES.values(), ids=BAD_ENTRIES.keys())
def test_a_bad_catalogue_entry_says_where_and_what_next(
    tmp_path: Path, entry: dict[str, str | None], changes: list[dict[str, str | None]]
) -> None:
    config = load_config(catalogue_config(tmp_path))
    path = tmp_path / "catalogue" / "e.toml"
    path.write_text(entry_text(entry, changes))
    with pytest.raises(ConfigError) as info:
        load_entries(config)
    assert_what_where_next(info.value, str(path))


@pytest.mark.parametrize("occurrence", [None, "1", "2"])
def test_a_good_entry_loads_and_its_occurrence_counts_from_1(
    tmp_path: Path, occurrence: str | None
) -> None:
    config = load_config(catalogue_config(tmp_path))
    (tmp_path / "catalogue" / "e.toml").write_text(entry_text({}, [{"occurrence": occurrence}]))
    (entry,) = load_entries(config)
    assert entry.changes[0].occurrence == int(occurrence or 0)


# --- the equivalents and findings files -------------------------------------------

EQUIVALENT = 'id = "m"\nfunction_sha256 = "abc"\nreason = "r"\nreviewed = "d"\n'
BAD_EQUIVALENTS = {
    "other tables": "x = 1\n",
    "not an array": 'equivalent = "m"\n',
    "empty sha256": f"[[equivalent]]\n{EQUIVALENT.replace('abc', '')}",
    "unknown key": f"[[equivalent]]\n{EQUIVALENT}colour = 1\n",
    "also not a list": f"[[equivalent]]\n{EQUIVALENT}also = 1\n",
    "also missing keys": f'[[equivalent]]\n{EQUIVALENT}[[equivalent.also]]\nid = "n"\n',
}


@pytest.mark.parametrize("body", BAD_EQUIVALENTS.values(), ids=BAD_EQUIVALENTS.keys())
def test_a_bad_equivalents_file_says_where_and_what_next(tmp_path: Path, body: str) -> None:
    path = tmp_path / "equivalents.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as info:
        load_equivalents(path)
    assert_what_where_next(info.value, str(path))


FINDING = 'title = "t"\ndoc = "bug.md"\nreleases = ["0.33.0"]\ntests = ["tests/t.py"]\n'
NO_TESTS = FINDING.replace("tests = [", "tests = [] #")
BAD_FINDINGS = {
    "not an array of tables": 'finding = "x"\n',
    "not a table": "finding = [1]\n",
    "shared id": f'[[finding]]\nid = "a"\n{FINDING}[[finding]]\nid = "a"\n{FINDING}',
    "not a release": f'[[finding]]\nid = "a"\n{FINDING.replace("0.33.0", "zz")}',
    "unknown key": f'[[finding]]\nid = "a"\n{FINDING}colour = 1\n',
    "empty id": f'[[finding]]\nid = ""\n{FINDING}',
    "no tests": f'[[finding]]\nid = "a"\n{NO_TESTS}',
    "no write-up": f'[[finding]]\nid = "a"\n{FINDING.replace("bug.md", "gone.md")}',
}


@pytest.mark.parametrize("body", BAD_FINDINGS.values(), ids=BAD_FINDINGS.keys())
def test_a_bad_findings_file_says_where_and_what_next(tmp_path: Path, body: str) -> None:
    path = tmp_path / "findings.toml"
    path.write_text(body)
    (tmp_path / "bug.md").write_text("the write-up")
    with pytest.raises(ConfigError) as info:
        load_findings(path, tmp_path)
    assert_what_where_next(info.value, str(path))


# --- every error the package raises -------------------------------------------------

# Errors known to lack a next detail, each with why it may: (file, function).
WITHOUT_NEXT: set[tuple[str, str]] = set()  # (file, function) exempt: none


def _error_classes(trees: dict[str, ast.Module]) -> set[str]:
    """The names of AuditError and its subclasses, in audit/core/errors.py and anywhere else."""
    names = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, AuditError)
    }
    while True:
        more = {
            node.name
            for tree in trees.values()
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
            and any(isinstance(base, ast.Name) and base.id in names for base in node.bases)
        }
        if more <= names:
            return names
        names |= more


def _sets_next(expr: ast.expr, scope: ast.AST, seen: frozenset[str] = frozenset()) -> bool:
    """Whether ``expr``, a ``details=`` argument in ``scope``, holds a "next" key: a dict
    display with one (or spreading one that does), a union with one, a variable assigned
    one or given one by ``variable["next"] = ...``, or another error's ``.details``."""
    if isinstance(expr, ast.Dict):
        return any(
            (isinstance(key, ast.Constant) and key.value == "next")
            or (key is None and _sets_next(value, scope, seen))
            for key, value in zip(expr.keys, expr.values, strict=True)
        )
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
        return _sets_next(expr.left, scope, seen) or _sets_next(expr.right, scope, seen)
    if isinstance(expr, ast.Attribute):
        return expr.attr == "details"  # passed on from the error it rewords
    if isinstance(expr, ast.Name) and expr.id not in seen:
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            for target in targets:
                if (
                    isinstance(target, ast.Name)
                    and target.id == expr.id
                    and _sets_next(value, scope, seen | {expr.id})
                ):
                    return True
                if (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == expr.id
                    and isinstance(target.slice, ast.Constant)
                    and target.slice.value == "next"
                ):
                    return True
    return False


def _constructions(tree: ast.Module, classes: set[str]) -> list[tuple[str, ast.Call, ast.AST]]:
    """Each call of an error class, with the function it is in (the module if none)."""
    found: list[tuple[str, ast.Call, ast.AST]] = []

    def visit(node: ast.AST, scope: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, child, child.name)
                continue
            if isinstance(child, ast.Call):
                func = child.func
                called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if called in classes:
                    found.append((name, child, scope))
            visit(child, scope, name)

    visit(tree, tree, "<module>")
    return found


def test_every_error_the_package_raises_says_what_to_do_next() -> None:
    trees = {
        path.relative_to(ROOT).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted((ROOT / "audit").rglob("*.py"))
    }
    classes = _error_classes(trees)
    assert {"ConfigError", "BaselineFailed", "ExecutorFailed"} <= classes
    checked, missing = 0, []
    for file, tree in trees.items():
        for function, call, scope in _constructions(tree, classes):
            if (file, function) in WITHOUT_NEXT:
                continue
            checked += 1
            details = next((k.value for k in call.keywords if k.arg == "details"), None)
            if details is None or not _sets_next(details, scope):
                missing.append(f"{file}:{call.lineno} ({function})")
    assert checked > 50  # the walk found the package's errors (115 when written)
    assert not missing, "errors without a next detail: " + ", ".join(missing)


def test_the_static_check_catches_an_error_without_next() -> None:
    source = (
        "def f(x):\n"
        "    raise ConfigError('a', details={'file': x})\n"
        "def g(x):\n"
        "    details = {'file': x}\n"
        "    raise ConfigError('b', details=details)\n"
        "def h(x):\n"
        "    raise ConfigError('c')\n"
        "def ok(x):\n"
        "    details = {'file': x}\n"
        "    details['next'] = 'do it'\n"
        "    raise ConfigError('d', details=details | {'more': x})\n"
        "def ok_too(x):\n"
        "    given: dict[str, str] = {'file': x, 'next': 'do it'}\n"
        "    raise ConfigError('e', details={'error': x, **given})\n"
    )
    tree = ast.parse(source)
    verdicts = {
        name: _sets_next(next(k.value for k in call.keywords), scope) if call.keywords else False
        for name, call, scope in _constructions(tree, {"ConfigError"})
    }
    assert verdicts == {"f": False, "g": False, "h": False, "ok": True, "ok_too": True}

"""Findings: the registry of real vLLM bugs, and how the baseline's red tests are sorted."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from audit.core.errors import ConfigError
from audit.setup.findings import Finding, load_findings, sort_red

BUG = Finding(
    id="bug",
    title="t",
    doc="docs/bug.md",
    releases=("0.32.0", "0.33.0"),
    tests=("tests/fence/test_b.py::test_bug",),
)


def test_a_registered_test_red_on_a_listed_release_is_a_finding() -> None:
    red = [
        "project/tests/fence/test_b.py::test_bug[sync]",
        "project/tests/fence/test_b.py::test_bug",
    ]
    result = sort_red(red, [], [BUG], "0.33.0")
    assert [(f.finding.id, f.failed, f.expected) for f in result.found] == [
        ("bug", tuple(sorted(red)), ())
    ]
    assert result.unexplained == ()
    assert result.unlisted == ()


def test_a_registered_test_red_on_another_release_is_named_with_its_finding() -> None:
    result = sort_red(["project/tests/fence/test_b.py::test_bug"], [], [BUG], "0.31.0")
    assert result.found == ()
    assert result.unlisted == (("project/tests/fence/test_b.py::test_bug", BUG),)


def test_any_other_red_test_is_unexplained_and_a_prefix_is_not_a_name() -> None:
    red = ["project/tests/fence/test_b.py::test_bug_two", "tests/v1/test_x.py::test_y"]
    result = sort_red(red, [], [BUG], "0.33.0")
    assert result.unexplained == tuple(red)
    assert result.found == ()


def test_expected_failures_count_only_when_registered_for_the_release() -> None:
    xfailed = ["project/tests/fence/test_b.py::test_bug", "project/tests/fence/test_c.py::t"]
    (found,) = sort_red([], xfailed, [BUG], "0.33.0").found
    assert (found.failed, found.expected) == ((), (xfailed[0],))
    assert sort_red([], xfailed, [BUG], "0.30.0") == sort_red([], [], [BUG], "0.30.0")


def test_the_registry_loads_and_checks_its_write_ups(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    registry = tmp_path / "docs" / "findings.toml"
    registry.write_text(
        '[[finding]]\nid = "a"\ntitle = "t"\ndoc = "docs/a.md"\nreleases = ["0.33.0"]\n'
        'tests = ["tests/fence/test_a.py::test_a"]\n'
    )
    with pytest.raises(ConfigError, match=r"write-up docs/a\.md does not exist"):
        load_findings(registry, tmp_path)
    (tmp_path / "docs" / "a.md").write_text("# a\n")
    (finding,) = load_findings(registry, tmp_path)
    assert finding.in_release("0.33.0")
    assert not finding.in_release("0.32.0")
    registry.write_text(registry.read_text().replace('"0.33.0"', '"soon"'))
    with pytest.raises(ConfigError, match="'soon' is not a vLLM release"):
        load_findings(registry, tmp_path)
    assert load_findings(tmp_path / "none.toml", tmp_path) == ()


def test_the_registry_names_exactly_the_tests_marked_known_bug(project_root: Path) -> None:
    """docs/findings.toml and the known_bug markers of tests/fence say the same."""
    registered = {
        (f.id, t)
        for f in load_findings(project_root / "docs" / "findings.toml", project_root)
        for t in f.tests
    }
    marked = set()
    for path in sorted((project_root / "tests" / "fence").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for decorator in node.decorator_list:
                if (
                    isinstance(decorator, ast.Call)
                    and isinstance(decorator.func, ast.Name)
                    and decorator.func.id == "known_bug"
                ):
                    finding = ast.literal_eval(decorator.args[0])
                    marked.add((finding, f"tests/fence/{path.name}::{node.name}"))
    assert marked
    assert registered == marked

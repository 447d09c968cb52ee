"""The upstream series' tooling on small inputs: its file, its trees, its patches, the
outcomes it reads back and the page it writes. The real series runs in `nox -s upstream`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from audit.core.errors import ConfigError, ExitCode, PatchDoesNotApply
from audit.setup.findings import Finding
from audit.upstream.checks import Check, Outcome, Score
from audit.upstream.idiom import problems
from audit.upstream.page import document, html_page, markdown, score_rows
from audit.upstream.runs import FAILED, PASSED, SKIPPED, read_junit
from audit.upstream.series import load_series
from audit.upstream.trees import TEST_FOLDER, build_tree, patched_files

ORIGINAL = "def fence(block_ids):\n    return set(block_ids)\n"
FIXED = (
    "def fence(block_ids):\n    # a block listed twice is fenced once\n    return set(block_ids)\n"
)


def git_diff(tmp: Path, relpath: str, old: str, new: str) -> str:
    """A patch as `git diff` writes it, from ``old`` to ``new`` at ``relpath``."""
    for side, text in (("a", old), ("b", new)):
        (tmp / side / relpath).parent.mkdir(parents=True, exist_ok=True)
        (tmp / side / relpath).write_text(text)
    done = subprocess.run(
        ["git", "diff", "--no-index", "--no-prefix", f"a/{relpath}", f"b/{relpath}"],
        cwd=tmp, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout


@pytest.fixture
def release(tmp_path: Path) -> tuple[Path, Path]:
    """A toy installed ``vllm`` package and a toy tests tree."""
    package = tmp_path / "site" / "vllm"
    (package / "kv").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "kv" / "fence.py").write_text(ORIGINAL)
    (package / "kv" / "other.py").write_text("X = 1\n")
    tests = tmp_path / "sdist"
    (tests / TEST_FOLDER).mkdir(parents=True)
    (tests / TEST_FOLDER / "utils.py").write_text("# vLLM's\n")
    (tests / "tests" / "conftest.py").write_text("")
    return package, tests


def test_a_patched_tree_changes_its_copy_and_links_the_rest(
    tmp_path: Path, release: tuple[Path, Path]
) -> None:
    package, tests = release
    patch = tmp_path / "fix.patch"
    patch.write_text(git_diff(tmp_path / "diff", "vllm/kv/fence.py", ORIGINAL, FIXED))
    drop = tmp_path / "test_fix.py"
    drop.write_text("def test_it(): pass\n")
    tree = build_tree(
        tmp_path / "work" / "fix", tests_root=tests, drop_in=[drop], vllm_root=package,
        patches=[patch], release="0.34.0",
    )  # fmt: skip
    assert (tree / "vllm" / "kv" / "fence.py").read_text() == FIXED
    assert not (tree / "vllm" / "kv" / "fence.py").is_symlink()
    assert (tree / "vllm" / "kv" / "other.py").is_symlink()
    assert (tree / TEST_FOLDER / "utils.py").is_symlink()
    assert (tree / TEST_FOLDER / "test_fix.py").read_text() == drop.read_text()
    # the originals are untouched: the installed package and the cached tests
    assert (package / "kv" / "fence.py").read_text() == ORIGINAL
    assert not (tests / TEST_FOLDER / "test_fix.py").exists()
    assert patched_files(patch) == ["vllm/kv/fence.py"]


def test_a_patch_that_does_not_apply_names_its_first_failing_hunk(
    tmp_path: Path, release: tuple[Path, Path]
) -> None:
    package, tests = release
    patch = tmp_path / "stale.patch"
    moved = ORIGINAL.replace("set(block_ids)", "frozenset(block_ids)")
    patch.write_text(git_diff(tmp_path / "diff", "vllm/kv/fence.py", moved, FIXED))
    with pytest.raises(PatchDoesNotApply) as raised:
        build_tree(
            tmp_path / "work" / "stale", tests_root=tests, vllm_root=package,
            patches=[patch], release="0.34.0",
        )  # fmt: skip
    line = raised.value.render()
    assert "stale.patch does not apply to vLLM 0.34.0" in line
    assert "first failing hunk: vllm/kv/fence.py:1" in line
    assert "\n" not in line
    assert raised.value.exit_code == ExitCode.PATCH_DOES_NOT_APPLY == 15
    assert (package / "kv" / "fence.py").read_text() == ORIGINAL


def test_a_patch_outside_vllm_is_refused(tmp_path: Path, release: tuple[Path, Path]) -> None:
    package, tests = release
    patch = tmp_path / "tests.patch"
    patch.write_text(git_diff(tmp_path / "diff", "tests/conftest.py", "", "X = 2\n"))
    with pytest.raises(ConfigError, match="outside vLLM's package"):
        build_tree(
            tmp_path / "work" / "t", tests_root=tests, vllm_root=package, patches=[patch],
            release="0.34.0",
        )  # fmt: skip


def series_dir(tmp_path: Path, text: str) -> Path:
    root = tmp_path / "upstream"
    (root / "tests").mkdir(parents=True)
    (root / "patches").mkdir()
    (root / "tests" / "test_bug.py").write_text("")
    (root / "tests" / "test_gaps.py").write_text("")
    (root / "patches" / "bug.patch").write_text("")
    (root / "series.toml").write_text(text)
    return root


GOOD = """
release = "0.34.0"
[[fix]]
finding = "bug"
test = "test_bug.py::test_it"
patch = "patches/bug.patch"
touches = ["vllm/kv/fence.py: fence"]
[gaps]
tests = ["test_gaps.py"]
"""


def test_the_series_file_names_fixes_and_gap_tests(tmp_path: Path) -> None:
    series = load_series(series_dir(tmp_path, GOOD), {"bug"})
    assert series.release == "0.34.0"
    assert [(f.finding, f.test_file, f.patch.name) for f in series.fixes] == [
        ("bug", "test_bug.py", "bug.patch")
    ]
    assert [p.name for p in series.test_files()] == ["test_bug.py", "test_gaps.py"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('finding = "bug"', 'finding = "typo"'), "is not a finding of docs/findings.toml"),
        (('test = "test_bug.py::test_it"', 'test = "test_bug::test_it"'), "must name a test"),
        (('patch = "patches/bug.patch"', 'patch = "patches/no.patch"'), "not a file"),
        (("[gaps]", "[gap]"), "unknown key 'gap'"),
        (('release = "0.34.0"', 'release = "main"'), "is not a release"),
    ],
)
def test_a_wrong_series_file_is_one_clear_error(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    root = series_dir(tmp_path, GOOD.replace(*change))
    with pytest.raises(ConfigError, match=message) as raised:
        load_series(root, {"bug"})
    assert "\n" not in raised.value.render()


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.v1.kv_connector.unit.offloading_connector.test_bug" name="test_a"/>
<testcase classname="tests.v1.kv_connector.unit.offloading_connector.test_bug" name="test_b[x]">
<failure message="AssertionError: request '0' block 3 read 7">long</failure></testcase>
<testcase classname="tests.v1.kv_connector.unit.offloading_connector.test_bug.TestK" name="test_c">
<skipped message="no GPU"/></testcase>
</testsuite></testsuites>"""


def test_outcomes_are_read_per_node_id(tmp_path: Path) -> None:
    junit = tmp_path / "j.xml"
    junit.write_text(JUNIT)
    folder = TEST_FOLDER
    assert [(o.test_id, o.outcome, o.message) for o in read_junit(junit)] == [
        (f"{folder}/test_bug.py::test_a", PASSED, ""),
        (f"{folder}/test_bug.py::test_b[x]", FAILED, "AssertionError: request '0' block 3 read 7"),
        (f"{folder}/test_bug.py::TestK::test_c", SKIPPED, "no GPU"),
    ]


def test_the_page_shows_each_check_and_both_scores(tmp_path: Path) -> None:
    series = load_series(series_dir(tmp_path, GOOD), {"bug"})
    finding = Finding("bug", "a <bug>", "docs/b.md", ("0.34.0",), ("t",), "wrong KV data")
    outcome = Outcome(release="0.34.0")
    outcome.checks += [
        Check("fails on the release", True, "AssertionError: block 3 read 7", "bug"),
        Check("passes with its patch", False, "failed: still reads 7", "bug"),
        Check("offloading folder passes, all patches", True, "700 passed"),
    ]
    outcome.release_score = Score(214, 214, {"flush": (57, 57)}, 191, {"flush": 51})
    outcome.gap_score = Score(213, 214, {"flush": (57, 57)}, 213, {"flush": 57})
    data = document(outcome, series, {"bug": finding})
    assert data["ok"] is False
    assert {n: (a, b) for n, a, b in score_rows(data)}["all"] == (
        "89.3% (191 of 214)",
        "99.5% (213 of 214)",
    )
    page = html_page(data)
    assert "a &lt;bug&gt;" in page
    assert "<bug>" not in page
    assert "FAILED" in page
    assert "wrong KV data" in page
    assert "| bug | wrong KV data | passes with its patch | FAILED |" in markdown(data)


VLLM_STYLE = """# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
import pytest

from tests.v1.kv_connector.unit.offloading_connector.utils import RequestRunner

pytestmark = pytest.mark.cpu_test
"""


def test_a_test_in_vllm_s_idiom_has_no_problem(tmp_path: Path) -> None:
    path = tmp_path / "test_ok.py"
    path.write_text(VLLM_STYLE)
    assert problems(path) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("# SPDX-License-Identifier: Apache-2.0\n", ""), "SPDX"),
        (("pytestmark = pytest.mark.cpu_test\n", ""), "cpu_test"),
        (("import pytest\n", "import pytest\nfrom audit.setup.findings import Finding\n"), "audit"),
        (("import pytest\n", "import pytest\nimport fence_harness\n"), "fence_harness"),
    ],
)
def test_a_test_not_in_vllm_s_idiom_is_named(
    tmp_path: Path, change: tuple[str, str], problem: str
) -> None:
    path = tmp_path / "test_bad.py"
    path.write_text(VLLM_STYLE.replace(*change))
    found = problems(path)
    assert len(found) == 1
    assert problem in found[0]


@pytest.mark.parametrize("ok", [True, False])
def test_check_exits_16_when_a_check_failed_and_writes_the_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ok: bool
) -> None:
    import audit.upstream.__main__ as upstream_main

    series = load_series(series_dir(tmp_path, GOOD), {"bug"})
    finding = Finding("bug", "a bug", "docs/b.md", ("0.34.0",), ("t",), "lost reuse")
    outcome = Outcome(release="0.34.0")
    outcome.checks.append(Check("passes with its patch", ok, "measured", "bug"))
    monkeypatch.setattr(upstream_main, "load_findings", lambda *_: (finding,))
    monkeypatch.setattr(upstream_main, "load_series", lambda *_: series)
    workspace = type("Workspace", (), {"release": "0.34.0"})()
    monkeypatch.setattr(upstream_main, "open_workspace", lambda *_: workspace)
    monkeypatch.setattr(upstream_main, "run_checks", lambda *_, **__: outcome)
    code = upstream_main.main(["check", "--reports", str(tmp_path / "reports")])
    assert code == (0 if ok else ExitCode.UPSTREAM_CHECK_FAILED)
    page = tmp_path / "reports" / "upstream" / "index.html"
    assert ("every check passed" if ok else "a check FAILED") in page.read_text()
    assert (tmp_path / "reports" / "upstream" / "upstream.json").is_file()


def test_a_ruff_that_is_not_there_is_one_line_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    import audit.upstream.__main__ as upstream_main

    code = upstream_main.main(["check", "--no-audit", "--ruff", "no/such/ruff"])
    assert code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--ruff no/such/ruff is not an executable" in err

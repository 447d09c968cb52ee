"""nox -s workloads-bench: which tests it times, and its errors (the timing itself
needs vLLM and a quiet machine: it is a benchmark, not a test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.core.errors import ConfigError, ExitCode
from audit.devtools import workloads_bench


def test_the_timed_tests_are_each_trees_own_random_workloads(project_root: Path) -> None:
    tests = workloads_bench.workload_tests(project_root)
    assert tests == [
        "tests/fence/test_fence_stateful.py::test_random_workloads_keep_every_fence_invariant",
        "tests/fence/test_fence_stateful.py::test_random_workloads_with_an_external_load_past_the_window",
        "tests/fence/test_fence_stateful.py::test_random_workloads_in_the_window_layouts",
        "tests/fence/test_fence_recurrent.py::test_random_recurrent_workloads_keep_every_fence_invariant",
        "tests/fence/test_fence_stateful.py::"
        "test_random_workloads_keep_every_fence_invariant_with_speculative_decoding",
    ]


def test_a_tree_without_random_workloads_is_refused(tmp_path: Path) -> None:
    (tmp_path / "audit" / "data").mkdir(parents=True)
    (tmp_path / "audit" / "data" / "defaults.toml").write_text("[suite]\n")
    with pytest.raises(ConfigError, match=r"no suite\.random-workloads"):
        workloads_bench.workload_tests(tmp_path)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--against", "no-such-revision-anywhere"], "git knows no such revision"),
        (["--against", "HEAD", "--rounds", "0"], "must be at least 1"),
        ([], "--against"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = workloads_bench.main([*argv, "--reports", str(tmp_path / "reports")])
    assert code == ExitCode.USAGE == 1
    err = capsys.readouterr().err
    assert says in err
    assert "Traceback" not in err
    assert not (tmp_path / "reports" / workloads_bench.REPORT).exists()

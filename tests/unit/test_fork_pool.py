"""The fork pool judges each job on its own: what the run judged before a mutant never
changes the order its tests run in, so never its verdict (a mutant that makes some
tests hang and others fail was a timeout or a kill depending on that order)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from audit.protocol import Job, MutantStatus, MutationSpec, Verdict, load_verdict, save_verdict
from audit.testproc import pool

TESTS = ("tests/t.py::quick", "tests/t.py::slow", "tests/t.py::killer")


def job(key: str) -> Job:
    return Job(
        key=key,
        id=key,
        function="Fence.flush",
        edits=(),
        tests=TESTS,
        budgets=dict.fromkeys(TESTS, 10.0),
        timeout_s=60.0,
    )


def spec(results: Path, target: Path) -> MutationSpec:
    return MutationSpec(
        overlay={},
        pytest_args=(),
        warm_up=(),
        target_module="toypkg.fence",
        target_path=str(target),
        results_dir=str(results),
        workers=1,
        max_hangs=3,
        jobs=(),
        forced_fail=job("forced"),
        whole_failure=False,
    )


def judge_by_last_test(spec: MutationSpec, source: str, items: object, job: Job) -> None:
    """Stands in for the judging fork: the tests as they reached it, the last one failing."""
    verdict = Verdict(MutantStatus.KILLED, job.tests[-1], "failed", job.tests)
    save_verdict(Path(spec.results_dir) / f"{job.key}.json", verdict)
    os._exit(0)


def test_a_kill_does_not_reorder_the_next_mutants_tests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "fence.py"
    target.write_text("class Fence:\n    def flush(self):\n        pass\n")
    monkeypatch.setattr(pool, "judge_in_fork", judge_by_last_test)
    monkeypatch.setattr(pool, "emit", lambda event: None)
    forks = pool.ForkPool(spec(tmp_path / "results", target), items={})

    forks.run([job("first"), job("second"), job("third")])

    for key in ("first", "second", "third"):
        verdict = load_verdict(tmp_path / "results" / f"{key}.json")
        assert verdict.tests_run == TESTS, key
        assert verdict.killed_by == "tests/t.py::killer"

"""The fork pool: a job in no chain runs its tests in its own order, whatever the run
judged before it; a job of a chain waits for the members before it and runs their
killers first, and a member judged in an earlier run counts as if judged now. Either
way the order does not depend on which fork finished first (a mutant that makes some
tests hang and others fail was a timeout or a kill depending on that order)."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

from audit.core.protocol import (
    Chain,
    Job,
    Member,
    MutantStatus,
    MutationSpec,
    Verdict,
    load_verdict,
    save_verdict,
)
from audit.testproc import loop, pool

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


def fake_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, judge: object, workers: int = 1
) -> pool.ForkPool:
    """A pool whose forks run ``judge`` instead of tests, results in tmp_path/results."""
    target = tmp_path / "fence.py"
    target.write_text("class Fence:\n    def flush(self):\n        pass\n")
    monkeypatch.setattr(pool, "judge_in_fork", judge)
    monkeypatch.setattr(pool, "emit", lambda event: None)
    return pool.ForkPool(
        dataclasses.replace(spec(tmp_path / "results", target), workers=workers), items={}
    )


def test_a_kill_does_not_reorder_the_next_unchained_mutants_tests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forks = fake_pool(tmp_path, monkeypatch, judge_by_last_test)

    forks.run([job("first"), job("second"), job("third")])

    for key in ("first", "second", "third"):
        verdict = load_verdict(tmp_path / "results" / f"{key}.json")
        assert verdict.tests_run == TESTS, key
        assert verdict.killed_by == "tests/t.py::killer"


def judge_by_killer(spec: MutationSpec, source: str, items: object, job: Job) -> None:
    """Stands in for the judging fork: runs the tests in the job's order up to the
    first of KILLERS, which kills."""
    run = []
    verdict = Verdict(MutantStatus.SURVIVED, tests_run=job.tests)
    for test in job.tests:
        run.append(test)
        if test in KILLERS:
            verdict = Verdict(MutantStatus.KILLED, test, "failed", tuple(run))
            break
    save_verdict(Path(spec.results_dir) / f"{job.key}.json", verdict)
    os._exit(0)


KILLERS = {"tests/t.py::killer"}


def chained(key: str, line: int) -> Job:
    return dataclasses.replace(job(key), lines=(line,), cost=1.0)


def test_a_chain_s_jobs_run_first_the_tests_that_killed_the_members_before_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forks = fake_pool(tmp_path, monkeypatch, judge_by_killer, workers=2)
    jobs = [chained("a", 3), chained("b", 3), chained("c", 4), chained("other", 3)]
    chain = Chain(tuple(Member(j.key, j.lines) for j in jobs[:3]))

    forks.run(jobs, [chain])

    def run(key: str) -> tuple[str, ...]:
        return load_verdict(tmp_path / "results" / f"{key}.json").tests_run

    # "a" starts the chain: its own order. "b" and "c" wait for it (two workers, yet
    # neither ran its three tests), then begin with its killer. "other" is in no chain.
    assert run("a") == TESTS
    assert run("b") == ("tests/t.py::killer",)
    assert run("c") == ("tests/t.py::killer",)
    assert run("other") == TESTS


def test_a_member_judged_in_an_earlier_run_guides_as_if_judged_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forks = fake_pool(tmp_path, monkeypatch, judge_by_killer)
    results = tmp_path / "results"
    cached = Verdict(MutantStatus.KILLED, "tests/t.py::killer", "failed", TESTS)
    save_verdict(results / "a.json", cached)
    chain = Chain((Member("a", (3,)), Member("b", (3,))))

    forks.run([chained("b", 3)], [chain])

    assert load_verdict(results / "b.json").tests_run == ("tests/t.py::killer",)


def test_the_pool_wakes_when_a_fork_ends_not_at_its_deadline() -> None:
    exits = pool._Exits()
    if not exits.usable:
        pytest.skip("no pidfd on this kernel")
    release, held = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(held)
        os.read(release, 1)  # ends once the test closes its end
        os._exit(0)
    os.close(release)
    exits.watch(pid)
    try:
        assert not exits.wait(0.2)  # the fork still runs: back at the deadline, not woken
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)
        os.close(held)
        # woken by the fork's end, not back at a deadline (each wait lasts at most 1 s)
        assert any(exits.wait(30.0) for _ in range(10))
        assert os.waitpid(pid, os.WNOHANG)[0] == pid
    finally:
        exits.forget(pid)
    assert not exits._fds


def test_without_pidfds_the_pool_looks_again_after_a_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", refused, raising=False)
    exits = pool._Exits()
    exits.watch(os.getpid())
    slept: list[float] = []
    monkeypatch.setattr(pool.time, "sleep", slept.append)

    exits.wait(30.0)

    assert not exits.usable
    assert slept == [pool.POLL_S]


def test_the_hub_s_client_is_closed_once_before_the_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[str] = []
    hub = type(sys)("huggingface_hub")
    hub.close_session = lambda: closed.append("closed")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)

    loop.settle_fork_hooks()

    assert closed == ["closed"]

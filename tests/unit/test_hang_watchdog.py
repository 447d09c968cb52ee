"""The rule that judges a test hung: CPU spent past its budget, or no CPU at all for a
fifth of it; a test slowed by a loaded machine is neither. And what a judging does
once tests hang: shorter budgets, up to an allowance, so a later failing test kills."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest

from audit.core.protocol import Job, MutantStatus, Verdict, hang_allowance
from audit.judging.jobs import ExecutorOptions
from audit.testproc import judge
from audit.testproc.judge import TICK_S, TestHung, _Alarm, time_budget


def ticks(alarm: _Alarm, samples: list[tuple[float, float]]) -> str:
    """Feed the watchdog (wall, CPU) samples, one per tick; the first reason given."""
    for wall, cpu in samples:
        reason = alarm.check(wall, cpu)
        if reason:
            return reason
    return ""


def test_a_spinning_test_is_stopped_when_its_cpu_budget_is_spent() -> None:
    spinning = [(t * TICK_S, t * TICK_S) for t in range(1, 40)]
    assert ticks(_Alarm(10.0), spinning) == ""  # 9.75 s of CPU: not yet
    assert ticks(_Alarm(5.0), spinning) == "> 5.0s of CPU"


def test_a_waiting_test_is_stopped_after_a_fifth_of_its_budget() -> None:
    alarm = _Alarm(10.0)
    # busy for 1 s, then waits on a lock: no CPU from there on
    samples = [(t * TICK_S, min(t * TICK_S, 1.0)) for t in range(1, 40)]
    reason = ticks(alarm, samples)
    assert reason.startswith("blocked 2.0s (no CPU")
    assert alarm.samples[-1][0] == pytest.approx(3.0)  # stopped 2 s into the wait


def test_a_short_budget_still_waits_two_seconds_before_calling_a_test_blocked() -> None:
    # a 2 s budget of CPU would make the window 0.4 s: too short to tell a wait from a
    # scheduling gap on a loaded machine, so the window has a floor
    idle = [(t * TICK_S, 0.0) for t in range(1, 40)]
    alarm = _Alarm(2.0)
    assert ticks(alarm, idle).startswith(f"blocked {judge.BLOCKED_MIN_S:.1f}s (no CPU")
    # the first sample is a tick in
    assert alarm.samples[-1][0] == pytest.approx(TICK_S + judge.BLOCKED_MIN_S)


def test_a_starved_test_is_never_stopped_by_the_wall_clock() -> None:
    # the machine's load leaves it a tenth of a core: 100 s of wall time, 9 s of CPU
    starved = [(t * TICK_S, t * TICK_S / 10) for t in range(1, 400)]
    assert ticks(_Alarm(10.0), starved) == ""


def test_time_budget_interrupts_a_real_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judge, "BLOCKED_MIN_S", 0.0)  # the window: a fifth of 1 s
    held = threading.Lock()
    held.acquire()
    start = time.monotonic()
    with pytest.raises(TestHung), time_budget(1.0) as alarm:
        held.acquire()  # nobody releases it
    assert "blocked" in alarm.reason
    assert time.monotonic() - start < 1.0  # a fifth of the budget, and a tick or two


def spin() -> None:
    while True:
        pass


def test_time_budget_interrupts_a_real_spin() -> None:
    with pytest.raises(TestHung), time_budget(0.5) as alarm:
        spin()
    assert alarm.reason == "> 0.5s of CPU"


def test_time_budget_leaves_a_quick_test_alone() -> None:
    with time_budget(1.0) as alarm:
        sum(range(1000))
    assert alarm.reason == ""


@dataclass
class Report:
    failed: bool
    longreprtext: str = "assert False"


def judged(
    monkeypatch: pytest.MonkeyPatch,
    behaviours: dict[str, Any],
    budgets: dict[str, float] | None = None,
) -> Verdict:
    """``run_tests`` over tests that behave as given (0.5 s budgets unless ``budgets``
    says otherwise, three hangs)."""

    def protocol(item: str, nextitem: object, log: bool) -> list[Report]:
        return behaviours[item]()  # type: ignore[no-any-return]

    monkeypatch.setattr(judge, "runtestprotocol", protocol)
    # the stand-in items are names: no pytest config, so no log capture to set up
    monkeypatch.setattr(judge.logs, "per_test_capture", lambda items: contextlib.nullcontext)
    tests = tuple(behaviours)
    job = Job("k", "m", "f", (), tests, dict.fromkeys(tests, 0.5) | (budgets or {}), 60.0)
    return judge.run_tests({t: t for t in tests}, job, max_hangs=3)  # type: ignore[misc]


def test_each_test_names_the_next_and_the_last_tears_everything_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # as pytest's own loop does: a fixture two tests share is set up once per fork
    chain: list[tuple[str, object]] = []

    def protocol(item: str, nextitem: object, log: bool) -> list[Report]:
        chain.append((item, nextitem))
        return [Report(failed=False)]

    monkeypatch.setattr(judge, "runtestprotocol", protocol)
    monkeypatch.setattr(judge.logs, "per_test_capture", lambda items: contextlib.nullcontext)
    job = Job("k", "m", "f", (), ("a", "b", "c"), dict.fromkeys("abc", 0.5), 60.0)
    items = {t: f"item {t}" for t in "abc"}
    verdict = judge.run_tests(items, job, max_hangs=3)  # type: ignore[arg-type]
    assert verdict.status is MutantStatus.SURVIVED
    assert chain == [("item a", "item b"), ("item b", "item c"), ("item c", None)]


def failing() -> list[Report]:
    return [Report(failed=True)]


def test_a_failure_after_three_hangs_still_kills(monkeypatch: pytest.MonkeyPatch) -> None:
    # a mutant that makes the first tests spin and a later one fail: the hangs
    # after the first get a fifth of their budget, so the failing test is reached
    start = time.monotonic()
    verdict = judged(monkeypatch, {"a": spin, "b": spin, "c": spin, "d": spin, "e": failing})
    assert verdict.status is MutantStatus.KILLED
    assert verdict.killed_by == "e"
    assert verdict.tests_run == ("a", "b", "c", "d", "e")
    # the hangs stay on the record: mutmut, which stops at the first, says timeout
    assert [test.split()[0] for test in verdict.hung] == ["a", "b", "c", "d"]
    assert time.monotonic() - start < 0.5 + 3 * (0.5 / judge.SHRINK + 2 * TICK_S)


def test_hangs_stop_the_judging_once_they_spent_the_allowance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tests = {f"t{i}": spin for i in range(40)} | {"last": failing}
    verdict = judged(monkeypatch, tests)
    assert verdict.status is MutantStatus.TIMEOUT
    # three full budgets: the first hang's, then a fifth of one per hang after it
    assert len(verdict.tests_run) == 1 + 2 * judge.SHRINK
    assert verdict.failure.startswith("hung: t0 > 0.5s of CPU, t1 > 0.1s of CPU")
    assert verdict.hung[:2] == ("t0 > 0.5s of CPU", "t1 > 0.1s of CPU")


def passing() -> list[Report]:
    return [Report(failed=False)]


def test_the_allowance_is_the_first_hung_test_s_not_the_largest_budgets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A slow test of the job (a 5 s budget) that passes does not buy the quick ones
    # that spin more hangs: the judging stops after three budgets of the first hung.
    tests = {"slow": passing} | {f"t{i}": spin for i in range(40)} | {"last": failing}
    verdict = judged(monkeypatch, tests, budgets={"slow": 5.0})
    assert verdict.status is MutantStatus.TIMEOUT
    assert len(verdict.tests_run) == 1 + 1 + 2 * judge.SHRINK


def spin_through_teardown() -> list[Report]:
    """A test whose cleanup loops too: it swallows the first stop and spins on (for
    5 s at most, so that a watchdog that never stops it again fails the test)."""
    try:
        spin()
    except TestHung:
        until = time.process_time() + 5.0
        while time.process_time() < until:
            pass
    return []


def test_a_teardown_that_spins_on_is_stopped_again() -> None:
    start = time.monotonic()
    with pytest.raises(TestHung), time_budget(0.5) as alarm:
        spin_through_teardown()
    assert alarm.reason == "> 0.5s of CPU"
    assert time.monotonic() - start < 0.5 + 0.1 + 4 * TICK_S


def test_the_backstop_leaves_room_for_the_largest_budget_hung_first() -> None:
    # hung first, the 5 s test allows 15 s of hangs, and the last hang may overrun it
    # by a fifth of a budget: the parent must not kill the fork before that
    options = ExecutorOptions(max_hangs=3)
    budgets = [0.5, 5.0, 2.0]
    worst = hang_allowance(5.0, 3) + 5.0 / judge.SHRINK
    slack = 30.0  # for the fork itself
    assert options.mutant_timeout(0.0, budgets) - slack >= worst

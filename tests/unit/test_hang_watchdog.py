"""The rule that judges a test hung: CPU spent past its budget, or no CPU at all for a
fifth of it; a test slowed by a loaded machine is neither."""

from __future__ import annotations

import threading
import time

import pytest

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


def test_a_starved_test_is_never_stopped_by_the_wall_clock() -> None:
    # the machine's load leaves it a tenth of a core: 100 s of wall time, 9 s of CPU
    starved = [(t * TICK_S, t * TICK_S / 10) for t in range(1, 400)]
    assert ticks(_Alarm(10.0), starved) == ""


def test_time_budget_interrupts_a_real_wait() -> None:
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

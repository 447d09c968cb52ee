"""The rule that judges a test hung: CPU spent past its budget, or no CPU at all for a
fifth of it; a test slowed by a loaded machine is neither."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

from audit.testproc.judge import TICK_S, TestHung, _Alarm, time_budget
from audit.testproc.pool import STUCK_FACTOR, fork_cpu_seconds, overdue


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


def test_a_judging_s_backstop_is_its_fork_s_cpu_time_not_the_wall_clock() -> None:
    """The backstop of a whole judging: a fork starved by a loaded machine (wall time
    past it, CPU time not) goes on; one that spent it is a timeout; one that uses no CPU
    at all is stopped at STUCK_FACTOR times it."""
    assert overdue(wall=50.0, cpu=50.0, backstop=60.0) == ""
    assert overdue(wall=90.0, cpu=40.0, backstop=60.0) == ""  # starved: a third of the CPU
    assert overdue(wall=90.0, cpu=61.0, backstop=60.0) == "no verdict within 60.0s of CPU"
    stuck = STUCK_FACTOR * 60.0 + 1
    assert (
        overdue(wall=stuck, cpu=0.5, backstop=60.0)
        == f"no verdict within {stuck:.1f}s (0.5s of CPU)"
    )
    assert overdue(wall=90.0, cpu=None, backstop=60.0) == ""  # ended: its verdict is read next


def test_a_fork_s_cpu_time_is_read_from_proc() -> None:
    spent = fork_cpu_seconds(os.getpid())
    assert spent is not None
    assert spent > 0
    started = time.process_time()
    while time.process_time() - started < 0.3:
        pass
    later = fork_cpu_seconds(os.getpid())
    assert later is not None
    assert later >= spent + 0.2
    child = subprocess.Popen(["true"])
    child.wait()
    assert fork_cpu_seconds(child.pid) is None  # reaped: gone from /proc

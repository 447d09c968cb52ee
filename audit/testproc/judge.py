"""The in-fork judge: one mutant switched on, its covering tests run, one verdict.

It runs in a process forked from the warm one, so the mutant's code never reaches
the parent or the other mutants; it writes its verdict to its own file and exits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import signal
import time
import types
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from _pytest.runner import runtestprotocol

from audit.core.protocol import (
    EXAMPLE,
    Job,
    MutantStatus,
    MutationSpec,
    Verdict,
    apply_edits,
    hang_allowance,
    save_verdict,
)
from audit.testproc import isolation, logs
from audit.testproc.codeswap import activate, function_text

FAILURE_LINES = 15  # of the killing test's report, its last ones (native traceback)
SHRINK = 5  # after a mutant's first hung test, each further test has 1/SHRINK of its budget
INTERRUPTED = 130  # a fork's exit status when it was interrupted: no verdict


def judge_in_fork(spec: MutationSpec, source: str, items: dict[str, pytest.Item], job: Job) -> None:
    """Switch ``job``'s mutant on, judge it, save the verdict, exit. Never returns."""
    # Every object inherited from the warm parent (vLLM, torch, the collected
    # session) goes to the permanent generation: the child's collections then
    # walk only what its tests allocate, not the whole inherited heap (and do
    # not touch, so copy, its pages). Measured on the sliding_window region,
    # 49 mutants: mutant phase 17.7 s -> 13.0-13.8 s.
    gc.freeze()
    code = 0
    started = time.monotonic()
    isolation.die_with_parent()
    os.environ.update(job.env)
    try:
        if job.module:  # another module than the target (the worker's)
            module, path, text = job.module, job.path, Path(job.path).read_text()
        else:
            module, path, text = spec.target_module, spec.target_path, source
        alone = function_text(text, job.edits, job.frame) if job.frame else None
        activate(module, path, job.function, alone or apply_edits(text, job.edits))
        verdict = run_tests(items, job, spec.max_hangs, spec.whole_failure)
    except (KeyboardInterrupt, SystemExit):
        # Interrupted from outside (Ctrl-C reaches the whole process group): that is
        # no verdict on the mutant, so none is written and nothing can be cached.
        os._exit(INTERRUPTED)
    except BaseException as error:  # the mutant broke its own switching-on
        verdict = Verdict(MutantStatus.ERROR, failure=f"{type(error).__name__}: {error}")
        code = 1
    verdict = dataclasses.replace(verdict, duration_s=round(time.monotonic() - started, 3))
    try:
        save_verdict(Path(spec.results_dir) / f"{job.key}.json", verdict)
    finally:
        os._exit(code)


def run_tests(
    items: dict[str, pytest.Item], job: Job, max_hangs: int, whole_failure: bool = False
) -> Verdict:
    """Run the job's tests, in the job's order, until one fails; a test over its
    budget counts as hung.

    Killed if a test fails; timeout if none fails but one hung; survived otherwise.
    A mutant that makes some tests spin often makes a later one fail: after the first
    hang, each further test gets a fifth of its budget (:data:`SHRINK`), and the
    judging gives up (timeout) once its hangs have spent ``max_hangs`` budgets of the
    first hung test. The order is fixed, so the verdict is the same in every run.
    """
    run: list[str] = []
    hung: list[str] = []
    allowance = 0.0  # set by the first hang
    spent = 0.0
    capture = logs.per_test_capture(items[t] for t in job.tests)
    for test_id, after in zip(job.tests, [*job.tests[1:], None], strict=True):
        run.append(test_id)
        budget = job.budgets[test_id] / SHRINK if hung else job.budgets[test_id]
        # The next test is named, as pytest's own run loop does, so a fixture both
        # share (module or session scope) is set up once, and everything is torn
        # down after the last one.
        nextitem = None if after is None else items[after]
        with time_budget(budget) as alarm, capture():
            try:
                reports = runtestprotocol(items[test_id], nextitem=nextitem, log=False)
            except TestHung:  # raised again outside the test's call (its teardown spun)
                reports = []
        if alarm.reason:
            if not hung:
                allowance = hang_allowance(budget, max_hangs)
            hung.append(f"{test_id} {alarm.reason}")
            spent += budget
            if spent >= allowance:
                break
            continue
        failed = next((r for r in reports if r.failed), None)
        if failed is not None:
            text = failure_text(failed.longreprtext, whole_failure)
            return Verdict(MutantStatus.KILLED, test_id, text, tuple(run), hung=tuple(hung))
    if hung:
        failure = f"hung: {', '.join(hung)}"
        return Verdict(
            MutantStatus.TIMEOUT, failure=failure, tests_run=tuple(run), hung=tuple(hung)
        )
    return Verdict(MutantStatus.SURVIVED, tests_run=tuple(run))


def failure_text(longrepr: str, whole_example: bool = False) -> str:
    """The failure kept in the verdict: its last lines; with ``whole_example``, a
    Hypothesis failure's falsifying example whole, after the lines before it."""
    lines = longrepr.splitlines()
    start = next((i for i, line in enumerate(lines) if EXAMPLE.match(line)), None)
    if not whole_example or start is None:
        return "\n".join(lines[-FAILURE_LINES:])
    return "\n".join(lines[max(0, start - FAILURE_LINES) :])


class TestHung(BaseException):
    """Raised into a test that overran its budget (a BaseException: code under test
    that catches ``Exception`` must not swallow it)."""

    __test__ = False


TICK_S = 0.25  # how often the watchdog looks at the test
BLOCKED_SHARE = 0.05  # less CPU than this share of the wall time: the test is waiting
BLOCKED_FRACTION = 0.2  # waiting for this fraction of its budget: the test is blocked
# ... and never for less than this much wall time: a short test's budget of CPU is short
# (a spin is caught early), but a wait is only judged over a span that a loaded
# machine's scheduling gaps do not fill.
BLOCKED_MIN_S = 2.0


@dataclass
class _Alarm:
    """Why the test was stopped ("" while it runs): the watchdog's state."""

    budget: float
    reason: str = ""
    raised: tuple[float, float] = (0.0, 0.0)  # (wall, CPU) when TestHung was last raised
    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (wall, CPU)

    def check(self, wall: float, cpu: float) -> str:
        """The reason to stop the test at this tick, or ""; ``wall`` and ``cpu`` are
        seconds since the test started.

        Two kinds of hang, both judged on what the test did, not on the machine's
        load. A test spinning (an endless loop) runs out of CPU budget: CPU time is
        not stretched by other processes as wall time is. A test blocked (a lock
        never released, a wait nobody ends) uses no CPU: it is stopped once it has
        used almost none for a fifth of its budget of wall time (at least
        :data:`BLOCKED_MIN_S`), instead of waiting out the whole budget. A test merely
        starved by a loaded machine does neither.
        """
        if cpu > self.budget:
            return f"> {self.budget:.1f}s of CPU"
        window = max(BLOCKED_FRACTION * self.budget, BLOCKED_MIN_S)
        self.samples.append((wall, cpu))
        while len(self.samples) > 1 and wall - self.samples[1][0] >= window:
            self.samples.popleft()
        then, cpu_then = self.samples[0]
        if wall - then >= window and cpu - cpu_then < BLOCKED_SHARE * (wall - then):
            return f"blocked {wall - then:.1f}s (no CPU; budget {self.budget:.1f}s)"
        return ""


@contextlib.contextmanager
def time_budget(seconds: float) -> Iterator[_Alarm]:
    """Watch the test in the block: stop it (:class:`TestHung`) when it hangs."""
    alarm = _Alarm(seconds)
    wall0, cpu0 = time.monotonic(), time.process_time()
    alarm.samples.append((0.0, 0.0))

    def tick(signum: int, frame: types.FrameType | None) -> None:
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        if alarm.reason:
            # Already stopped: let the test unwind, but not forever. A teardown that
            # loops too (a runner draining jobs a mutant never completes) is stopped
            # again each time it spends a fifth of the budget of CPU, or a whole
            # budget of wall time.
            if (
                cpu - alarm.raised[1] < BLOCKED_FRACTION * seconds
                and wall - alarm.raised[0] < seconds
            ):
                return
        else:
            alarm.reason = alarm.check(wall, cpu)
            if not alarm.reason:
                return
        alarm.raised = (wall, cpu)
        raise TestHung(f"fence-audit: test hung ({alarm.reason})")

    previous = signal.signal(signal.SIGALRM, tick)
    signal.setitimer(signal.ITIMER_REAL, TICK_S, TICK_S)
    try:
        yield alarm
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

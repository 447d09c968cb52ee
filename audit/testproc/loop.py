"""The warm mutant loop: collect once, warm up, prove mutants switch on, judge them all.

It runs in the baseline's process once the baseline is done (:mod:`.baseline`), or
in a process of its own (``python -m audit.testproc`` with a mutation spec: tests,
the benchmark's cold figure, and whenever the warm process is gone), where it
replaces pytest's run loop.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import pytest
from _pytest.runner import runtestprotocol

from audit.core.protocol import (
    Done,
    ForcedFailChecked,
    MissingTests,
    MutantStatus,
    MutationSpec,
    Verdict,
    Warmed,
    load_verdict,
)
from audit.testproc import heap, hugepages, logs
from audit.testproc.channel import emit, os_threads
from audit.testproc.pool import ForkPool

# Moving the warm process to huge pages takes about a second and saves each fork about
# 15 ms (vLLM 0.33.0's scheduler, two workers): worth it from about 70 forks per
# worker, done from this many in a process of its own. The baseline's process does it
# while it waits for its command, whatever the number (:mod:`.baseline`).
HUGE_PAGES_PER_WORKER = 100


class MutantLoop:
    """A pytest plugin that replaces the run loop with the mutant loop."""

    def __init__(self, spec: MutationSpec) -> None:
        self.spec = spec

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        heap.stop_freezing()  # the warm-up's objects are collected as CPython does
        self.judge_all(session)
        return True

    def judge_all(self, session: pytest.Session, *, warmed: Warmed | None = None) -> None:
        """The mutant loop over a collected session, warmed up here unless ``warmed``
        says how it already was (the baseline's process: :func:`warm_up`)."""
        items = {item.nodeid: item for item in session.items}
        wanted = {t for job in self.spec.jobs for t in job.tests}
        missing = sorted(wanted - set(items))
        if missing:
            emit(MissingTests(tuple(missing[:20]), len(missing)))
            return
        if warmed is None:
            warmed = warm_up([items[t] for t in self.spec.warm_up], len(items))
            if len(self.spec.jobs) >= HUGE_PAGES_PER_WORKER * max(1, self.spec.workers):
                megabytes, seconds = collapse_memory()
                warmed = dataclasses.replace(warmed, huge_mb=megabytes, huge_s=seconds)
        settle_fork_hooks()
        logs.settle()
        emit(warmed)
        pool = ForkPool(self.spec, items)
        # Prove that a mutant really switches on before trusting any survivor.
        check = self.spec.forced_fail
        pool.run([check])
        path = pool.verdict_path(check)
        if path.is_file():
            verdict = load_verdict(path)
            path.unlink()
        else:
            verdict = Verdict(MutantStatus.ERROR, failure="the check's fork left no verdict")
        emit(ForcedFailChecked(verdict))
        if verdict.status is not MutantStatus.KILLED:
            return
        pool.run(self.spec.jobs, self.spec.chains)
        # Every verdict is written: what is left (pytest's session teardown, the
        # interpreter's exit) is of no use, and the caller may kill us now.
        emit(Done())


def settle_fork_hooks() -> None:
    """Do once, before the first fork, what an at-fork hook would redo in every fork.

    ``huggingface_hub`` closes its HTTP client in each forked child (3-4.5 ms a fork
    with vLLM's scheduler tests, which made one). Closed here, the hook finds none:
    each fork starts as it would have after its hook, without the client. The tests
    run offline (``HF_HUB_OFFLINE``); a test that asks for the client gets a new one,
    as it would have in the fork.
    """
    hub = sys.modules.get("huggingface_hub")
    close = getattr(hub, "close_session", None)
    if callable(close):
        close()


def collapse_memory() -> tuple[int, float]:
    """Move this process's memory to huge pages: each fork then copies a page-table
    entry per 2 MiB instead of per 4 KiB (DESIGN.md, "The executor"). Returns the
    megabytes moved and the seconds it took."""
    started = time.monotonic()
    collapsed = hugepages.collapse()
    return collapsed.megabytes, round(time.monotonic() - started, 3)


def warm_up(tests: list[pytest.Item], collected: int) -> Warmed:
    """Run ``tests`` once here, so each fork starts fully warm.

    A test's first run in a process pays one-time work (lazy imports, caches,
    up to 2 s for some of vLLM's tests); paid once here, every fork inherits
    it and runs each test at its steady-state speed. The baseline proved these
    tests green. Thread counts before and after are reported: a test that left
    threads running would make forking hazardous.
    """
    threads = os_threads()
    started = time.monotonic()
    red = []
    for item in tests:
        reports = runtestprotocol(item, nextitem=None, log=False)
        if any(r.failed for r in reports):
            red.append(item.nodeid)
    seconds = round(time.monotonic() - started, 3)
    return Warmed(collected, len(tests), os_threads(), seconds, threads, tuple(red[:10]))


def run(spec: MutationSpec) -> int:
    """A new executor process: pytest collects the suite, then the mutant loop runs."""
    return int(pytest.main(list(spec.pytest_args), plugins=[MutantLoop(spec)]))

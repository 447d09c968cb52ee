"""The fork pool: one fork per mutant, a few at a time, each with a deadline.

The pool's process never runs a test itself while it forks, so no test starts
threads (torch's pools, vLLM's helpers) in it before a fork. Each fork runs its job's
tests in the job's own order: a verdict depends on the mutant, never on what this run
judged before it (DESIGN.md, "The executor").
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from audit.core.protocol import (
    Chain,
    Job,
    Judged,
    MutantStatus,
    MutationSpec,
    Verdict,
    load_verdict,
    save_verdict,
)
from audit.testproc.channel import emit
from audit.testproc.judge import judge_in_fork
from audit.testproc.order import Schedule

POLL_S = 0.005  # how often to look for ended forks where a pidfd cannot tell (see _Exits)


@dataclass(frozen=True, slots=True)
class _Running:
    job: Job
    started: float
    deadline: float


class ForkPool:
    """Judges jobs in forks of this (warm) process, ``spec.workers`` at a time."""

    def __init__(self, spec: MutationSpec, items: dict[str, pytest.Item]) -> None:
        self.spec = spec
        self.items = items
        self.results = Path(spec.results_dir)
        self.results.mkdir(parents=True, exist_ok=True)
        self.source = Path(spec.target_path).read_text()

    def run(self, jobs: Iterable[Job], chains: Iterable[Chain] = ()) -> None:
        """Judge ``jobs``, a chain's one after the other (:mod:`.order`)."""
        running: dict[int, _Running] = {}
        exits = _Exits()
        try:
            self._run(Schedule(jobs, chains, self.verdict), running, exits)
        finally:  # interrupted: no fork outlives the pool (their verdicts are not written)
            for pid in running:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            exits.close()

    def _run(self, schedule: Schedule, running: dict[int, _Running], exits: _Exits) -> None:
        workers = max(1, self.spec.workers)
        while running or schedule:
            while len(running) < workers:
                job = schedule.take()
                if job is None:
                    if not running:  # cannot be: a job waits only for one being judged
                        raise RuntimeError("every job left waits, and none is being judged")
                    break
                started = time.monotonic()
                pid = os.fork()
                if pid == 0:
                    judge_in_fork(self.spec, self.source, self.items, job)  # never returns
                running[pid] = _Running(job, started, started + job.timeout_s)
                exits.watch(pid)
            pid, status = os.waitpid(-1, os.WNOHANG) if running else (0, 0)
            now = time.monotonic()
            if pid:
                exits.forget(pid)
                done = running.pop(pid)
                self.settled(done.job, status, now - done.started)
                schedule.settled(done.job.key)
                continue
            for pid, late in list(running.items()):
                if now > late.deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    exits.forget(pid)
                    running.pop(pid)
                    failure = f"no verdict within {late.job.timeout_s:.1f}s"
                    verdict = Verdict(
                        MutantStatus.TIMEOUT,
                        failure=failure,
                        duration_s=round(now - late.started, 3),
                    )
                    save_verdict(self.verdict_path(late.job), verdict)
                    emit(Judged(late.job.id, MutantStatus.TIMEOUT))
                    schedule.settled(late.job.key)
            if running:
                exits.wait(min(r.deadline for r in running.values()) - now)

    def verdict_path(self, job: Job) -> Path:
        return self._path(job.key)

    def verdict(self, key: str) -> Verdict | None:
        """The verdict written under ``key`` (this run's or the cache's), if any."""
        path = self._path(key)
        return load_verdict(path) if path.is_file() else None

    def _path(self, key: str) -> Path:
        return self.results / f"{key}.json"

    def settled(self, job: Job, status: int, duration: float) -> None:
        """A fork ended: read its verdict, or say why there is none."""
        path = self.verdict_path(job)
        if not path.is_file():
            # Interrupted, or died in a way no test reports: not a verdict on the
            # mutant, so nothing is written and the next run judges it again.
            reason = (
                f"killed by signal {os.WTERMSIG(status)}"
                if os.WIFSIGNALED(status)
                else f"exit status {os.waitstatus_to_exitcode(status)}"
            )
            failure = f"the judging process ended without a verdict ({reason})"
            emit(Judged(job.id, MutantStatus.ERROR, None, round(duration, 3), failure))
            return
        verdict = load_verdict(path)
        emit(Judged(job.id, verdict.status, verdict.duration_s, round(duration, 3)))


class _Exits:
    """Sleeps until a fork ends, or until the first deadline.

    Each fork is watched through a pidfd (Linux 5.3 and later), readable once it has
    ended, so the pool wakes as it ends: a look every 5 ms left a worker idle for
    half of that, on average, after each fork. Where pidfds are not to be had, it
    looks every :data:`POLL_S`.
    """

    def __init__(self) -> None:
        self._poll = select.poll()
        self._fds: dict[int, int] = {}  # pid -> its pidfd
        self.usable = hasattr(os, "pidfd_open")

    def watch(self, pid: int) -> None:
        if not self.usable:
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # an older kernel, or a sandbox without the call
            self.usable = False
            self.close()
            return
        self._fds[pid] = fd
        self._poll.register(fd, select.POLLIN)

    def forget(self, pid: int) -> None:
        fd = self._fds.pop(pid, None)
        if fd is not None:
            self._poll.unregister(fd)
            os.close(fd)

    def wait(self, seconds: float) -> bool:
        """Until a watched fork ends, at most ``seconds`` (never less than a millisecond,
        never more than one second): whether a fork's end woke it."""
        if not self.usable:
            time.sleep(POLL_S)
            return False
        return bool(self._poll.poll(max(1, min(1000, round(seconds * 1000)))))

    def close(self) -> None:
        for pid in list(self._fds):
            self.forget(pid)

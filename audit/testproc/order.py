"""Which mutant is judged next, and which of its tests runs first.

A test that killed one mutant of a function often kills the function's other mutants,
above all those on the same line. So the mutants of a function form a chain in a
fixed order (:class:`audit.core.protocol.Chain`), and a job of the chain runs first the
tests that killed the members before it: those that killed a member on one of its
lines, then those that killed any member, each group by how many they killed. A
survivor still runs every covering test; a killed mutant mostly runs one.

The order of a job's tests depends only on the verdicts of the members before it,
never on which fork finished first: the same mutants give the same orders in every
run, and a member judged in an earlier run (its verdict in the cache) counts as it
would have counted had it been judged now. vLLM's tests stay before this project's,
so a kill by this project's suite still means that no test of vLLM's killed the
mutant (the report's "vLLM alone" score).

Only one job of a chain is judged at a time. The pool takes, of the jobs that may
start, the one whose chain has the most predicted work left (longest first), so the
long chains do not end the run alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Iterable

from audit.core.protocol import Chain, Job, Member, MutantStatus, Verdict, is_project_test


def guided(
    tests: tuple[str, ...], lines: tuple[int, ...], kills: Iterable[tuple[tuple[int, ...], str]]
) -> tuple[str, ...]:
    """``tests`` reordered by ``kills`` (each member's lines and its killer): killers on
    one of ``lines`` first, then the other killers, then the rest, each in its own
    order otherwise; vLLM's tests before this project's."""
    own = set(lines)
    near: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    for member_lines, killer in kills:
        anywhere[killer] += 1
        if own.intersection(member_lines):
            near[killer] += 1
    if not anywhere:
        return tests
    position = {test: i for i, test in enumerate(tests)}
    return tuple(
        sorted(tests, key=lambda t: (is_project_test(t), -near[t], -anywhere[t], position[t]))
    )


class Schedule:
    """The jobs not yet started; :meth:`take` gives one that may start now.

    ``verdict_of``: a settled member's verdict by its key (None: it has none, as when
    its judging ended without one)."""

    def __init__(
        self,
        jobs: Iterable[Job],
        chains: Iterable[Chain],
        verdict_of: Callable[[str], Verdict | None],
    ) -> None:
        self.waiting: dict[str, Job] = {job.key: job for job in jobs}
        self._busy: dict[str, _Progress] = {}  # a job being judged -> its chain
        self.verdict_of = verdict_of
        self._chains: list[_Progress] = []
        self._kills: dict[str, tuple[tuple[int, ...], str] | None] = {}
        chained: set[str] = set()
        for chain in chains:
            keys = [member.key for member in chain.members]
            if chained.intersection(keys) or len(set(keys)) != len(keys):
                raise ValueError("a mutant is in more than one place of the chains")
            chained.update(keys)
            if any(key in self.waiting for key in keys):
                left = math.fsum(self.waiting[k].cost for k in keys if k in self.waiting)
                self._chains.append(_Progress(chain.members, left))
        # A job in no chain is a chain of its own.
        for key, job in self.waiting.items():
            if key not in chained:
                self._chains.append(_Progress((Member(key, job.lines),), job.cost))

    def __bool__(self) -> bool:
        """Jobs left to start."""
        return bool(self.waiting)

    def settled(self, key: str) -> None:
        """``key``'s judging ended (its verdict, if any, is written)."""
        self._busy.pop(key, None)

    def take(self) -> Job | None:
        """The next job to start (its tests in their guided order), or None when every
        job left waits for a verdict still being reached."""
        best: _Progress | None = None
        for chain in self._chains:
            if self._may_start(chain) and (best is None or chain.left > best.left):
                best = chain
        if best is None:
            return None
        member = best.members[best.next]
        job = self.waiting.pop(member.key)
        self._busy[member.key] = best
        best.left -= job.cost
        kills = [k for k in map(self._kill, best.members[: best.next]) if k is not None]
        best.next += 1
        order = guided(job.tests, job.lines, kills)
        return job if order == job.tests else dataclasses.replace(job, tests=order)

    def _may_start(self, chain: _Progress) -> bool:
        """Whether the chain's next job may start: every member before it has its
        verdict (members not judged in this run have theirs already)."""
        if any(busy is chain for busy in self._busy.values()):  # one job per chain at a time
            return False
        members = chain.members
        while chain.next < len(members) and members[chain.next].key not in self.waiting:
            chain.next += 1
        return chain.next < len(members)

    def _kill(self, member: Member) -> tuple[tuple[int, ...], str] | None:
        """A member's lines and killer, if it was killed."""
        if member.key not in self._kills:
            verdict = self.verdict_of(member.key)
            kill = None
            if verdict is not None and verdict.status is MutantStatus.KILLED:
                kill = (member.lines, verdict.killed_by)
            self._kills[member.key] = kill
        return self._kills[member.key]


@dataclasses.dataclass(slots=True)
class _Progress:
    """A chain being judged: its members, how far it got, its predicted work left."""

    members: tuple[Member, ...]
    left: float
    next: int = 0  # the first member that may not have its verdict yet

"""Shards: one run's mutants dealt over N jobs (``mutate --shard K/N``), each judging
its part, and put back together by ``fence-audit merge`` (:mod:`audit.results.merge`).

The partition is a function of its inputs alone, so every process that computes it
from the same mutants and test durations gets the same answer: the run's mutants,
sorted by id, are dealt by predicted cost (:func:`audit.judging.jobs.predicted_cost`, the
baseline durations of their covering tests, counted in whole microseconds so that no
sum depends on an order), the dearest first, each to the shard with the least cost
so far, then the fewest mutants, then the lowest index (longest processing time
first: N jobs end at about the same time). No dict order, set order or hash enters
it. A mutant that no test reaches costs nothing and is dealt too (it is judged "no
tests" at once), so the shards' union is the whole run.

Durations are measured, and two baselines never time a test alike: shards that each
time their own baseline would deal differently, and some mutant would be judged by
no shard. So every shard must deal from the same durations: ``--shard-costs FILE``
(a ``coverage-map.json``, written once for all of them), or one baseline that every
shard reads back from the baseline cache. ``costs`` in each shard's marker is the
digest of the durations it dealt by, and merge refuses shards that differ in it.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit.core.errors import ConfigError
from audit.core.inputs import brief, regular_file
from audit.judging.jobs import predicted_cost
from audit.results.schema import Fields, Invalid
from audit.setup.model import COVERAGE_MAP_FORMAT, Mutant

MICROSECONDS = 1_000_000
# A GitHub Actions matrix runs at most 256 jobs; past this a count is a mistake, and
# every shard costs a slot in the partition and a line in merge's checks.
MOST_SHARDS = 1000


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``K/N``, with 1 <= K <= N; ValueError saying what is wrong otherwise."""
        found = re.fullmatch(r"([0-9]{1,9})/([0-9]{1,9})", text)  # ASCII digits only
        if found is None:
            raise ValueError(f"{text!r} is not of the form K/N (for example 2/4)")
        shard = cls(int(found[1]), int(found[2]))
        if shard.count < 1 or not 1 <= shard.index <= shard.count:
            raise ValueError(f"{text!r}: K must lie in 1..N, and N be at least 1")
        if shard.count > MOST_SHARDS:
            raise ValueError(f"{text!r}: N must be at most {MOST_SHARDS}")
        return shard


def cost(mutant: Mutant, durations: Mapping[str, float]) -> int:
    """A mutant's predicted cost in whole microseconds (integers add up the same in
    any order)."""
    return round(predicted_cost(mutant, durations) * MICROSECONDS)


def partition(
    mutants: Sequence[Mutant], durations: Mapping[str, float], count: int
) -> tuple[tuple[str, ...], ...]:
    """The ids of each shard's mutants (shard 1 first), each shard's in the order of
    ``mutants``."""
    costs = {mutant.id: cost(mutant, durations) for mutant in mutants}
    lightest = [(0, 0, index) for index in range(count)]  # (cost, mutants, index): a heap
    dealt: list[set[str]] = [set() for _ in range(count)]
    for mutant_id in sorted(costs, key=lambda i: (-costs[i], i)):
        load, held, index = heapq.heappop(lightest)
        dealt[index].add(mutant_id)
        heapq.heappush(lightest, (load + costs[mutant_id], held + 1, index))
    return tuple(tuple(m.id for m in mutants if m.id in ids) for ids in dealt)


def costs_digest(durations: Mapping[str, float]) -> str:
    """The sha256 of the durations a partition was dealt by, as the partition reads
    them (whole microseconds): equal digests, equal partitions of the same mutants."""
    rows = sorted((test, round(seconds * MICROSECONDS)) for test, seconds in durations.items())
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """One shard's part of a run, and what merge needs to check it."""

    shard: Shard
    run: tuple[str, ...]  # every mutant id of the run, in the run's order
    mutants: tuple[str, ...]  # this shard's, in the run's order
    costs: str  # costs_digest of the durations it was dealt by

    def marker(self, equivalents: Sequence[str]) -> dict[str, Any]:
        """audit.json's ``shard``; ``equivalents``: the ids of the equivalents records
        the whole run lists, in the file's order (each shard lists only those of its
        own mutants, and the absent ones)."""
        return {
            "index": self.shard.index,
            "count": self.shard.count,
            "mutants": list(self.mutants),
            "run": list(self.run),
            "equivalents": list(equivalents),
            "costs": self.costs,
        }


def plan(shard: Shard, mutants: Sequence[Mutant], durations: Mapping[str, float]) -> ShardPlan:
    """Shard ``shard``'s part of the run of ``mutants``, dealt by ``durations``."""
    dealt = partition(mutants, durations, shard.count)
    return ShardPlan(
        shard, tuple(m.id for m in mutants), dealt[shard.index - 1], costs_digest(durations)
    )


def read_costs(path: Path) -> dict[str, float]:
    """``--shard-costs``: each test's baseline duration, from a ``coverage-map.json``
    (``fence-audit coverage`` writes one), for every shard to deal by the same."""
    given = {"file": str(path), "next": "give the coverage-map.json `fence-audit coverage` writes"}
    try:
        document = json.loads(regular_file(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:  # ValueError: not JSON, not UTF-8
        raise ConfigError(
            "the --shard-costs file cannot be read as JSON",
            details={"error": brief(error), **given},
        ) from None
    try:
        body = Fields(document, "")
        if body.raw("format") != COVERAGE_MAP_FORMAT:
            raise Invalid("format", f"expected {COVERAGE_MAP_FORMAT} (a coverage map)")
        durations = {}
        for test in body.objects("tests"):
            durations[test.text("id")] = test.number("duration_s")
            test.close()
    except Invalid as error:
        raise ConfigError(
            f"the --shard-costs file is not a coverage map: {error}", details=given
        ) from None
    return durations

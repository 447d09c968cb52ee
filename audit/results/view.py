"""The results view: the frozen dataclasses every report renders, and nothing else.

:class:`AuditResults` is a saved run as the renderers (:mod:`audit.rendering.reports`
lists them) and the gate (:mod:`audit.results.gate`) read it: its mutants, regions,
source, catalogue, equivalents, findings, change and shard, every tally recomputed from
the mutants. :mod:`audit.results.report_model` reads ``audit.json`` into it; nothing
here reads a file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from audit.core.protocol import MutantStatus
from audit.judging import alone
from audit.mutation.changes import OUTSIDE
from audit.mutation.scope import APART
from audit.results.scores import Tally, killed_by_vllm
from audit.setup.model import Fraction

STATUS_ORDER = (
    MutantStatus.SURVIVED,
    MutantStatus.TIMEOUT,
    MutantStatus.ERROR,
    MutantStatus.NO_TESTS,
    MutantStatus.EQUIVALENT,
    MutantStatus.KILLED,
)


@dataclass(frozen=True, slots=True)
class SecondJudgement:
    """A mutant judged again by a part of the suite alone (:mod:`audit.judging.alone`)."""

    status: MutantStatus
    killed_by: str = ""
    failure: str = ""
    duration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class MutantRecord:
    id: str
    region: str
    origin: str  # "mutmut" or "catalogue"
    function: str
    operator: str  # mutmut's operator, or the catalogue entry's id
    line: int
    status: MutantStatus
    killed_by: str
    failure: str
    covered_by: tuple[str, ...]
    tests_run: int
    duration_s: float
    diff: str
    cached: bool = False  # the verdict came from the result cache of an earlier run
    hung: tuple[str, ...] = ()  # tests stopped as hung before the verdict, with why
    module: str = ""  # another module than the target (catalogue entries of the worker)
    path: str = ""  # that module's file
    equivalence: str = ""  # the reviewed reason, for a mutant recorded as equivalent
    title: str = ""  # catalogue entries: what the bug is
    invariant: str = ""  # catalogue entries: the fence invariant it breaks
    expected: str = ""  # catalogue entries: which suite should kill it
    verdict: str = ""  # catalogue entries: how the outcome compares with ``expected``
    bug: str = ""
    symptom: str = ""
    history: str = ""
    lines: tuple[int, ...] = ()  # the lines of the audited file it changes
    random: SecondJudgement | None = None  # by the random workloads alone (--random-alone)
    deep: SecondJudgement | None = None  # a survivor's deep second look (--deep)

    @property
    def killed_by_random(self) -> bool:
        """Counted in the score, and killed by the random workloads alone."""
        return alone.killed(self.status, self.random.status if self.random else None)

    @property
    def anchor(self) -> str:
        """An HTML id for this mutant: its id with every unsafe character replaced."""
        return "m-" + re.sub(r"[^A-Za-z0-9_.-]", "-", self.id)

    @property
    def label(self) -> str:
        return self.title or self.operator


@dataclass(frozen=True, slots=True)
class RegionResult:
    name: str
    description: str
    functions: tuple[str, ...]
    tally: Tally
    lines: Fraction
    branches: Fraction
    missed_lines: tuple[int, ...]
    killed_by_vllm: int = 0  # killed by a test of vLLM's own suite
    absent: tuple[str, ...] = ()  # parts this release does not have yet
    killed_by_random: int | None = None  # by the random workloads alone; None: not measured

    @property
    def vllm_score(self) -> float | None:
        """The score vLLM's suite alone earns (its tests run first for every mutant)."""
        return Fraction(self.killed_by_vllm, self.tally.judged).percent

    @property
    def random_score(self) -> float | None:
        """The score the random workloads alone earn (None: not measured)."""
        if self.killed_by_random is None:
            return None
        return Fraction(self.killed_by_random, self.tally.judged).percent


@dataclass(frozen=True, slots=True)
class CatalogueRecord:
    """A catalogue entry of the run's regions: applied (then also a mutant), stale,
    carried (the release already has the bug) or not yet (its code came later)."""

    id: str
    region: str
    title: str
    invariant: str
    expected: str
    file: str
    state: str  # applied, stale, carried or not yet
    reason: str

    @property
    def stale(self) -> bool:
        return self.state == "stale"


@dataclass(frozen=True, slots=True)
class EquivalentRecord:
    """A reviewed equivalence verdict and what became of it in this run."""

    id: str
    state: str  # applied, expired, killed, not survived, absent
    reason: str
    reviewed: str


@dataclass(frozen=True, slots=True)
class SourceLine:
    number: int
    text: str
    coverage: str | None  # "covered", "partly", "missed"; None: not a statement
    region: str | None
    tests: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SourceFunction:
    name: str
    start: int
    end: int
    regions: tuple[str, ...]
    lines: tuple[SourceLine, ...]


@dataclass(frozen=True, slots=True)
class FindingRecord:
    """A real vLLM bug this release has: its tests failed on the unmutated code and
    judged no mutant (docs/findings.toml)."""

    id: str
    title: str
    doc: str
    releases: tuple[str, ...]
    tests: tuple[str, ...]
    left_out: tuple[str, ...] = ()  # red on the unmutated code: they judged no mutant


@dataclass(frozen=True, slots=True)
class ChangeRecord:
    """A pull-request run (``--since REF``): what was compared, and the score of every
    mutant of the run (all lie on changed code; the group outside the regions too)."""

    ref: str
    commit: str
    path: str
    old_path: str  # the target's path at ``ref``; "" when the file is new since
    lines: tuple[tuple[int, int], ...]  # changed lines, as inclusive runs
    deletions: tuple[int, ...]  # pure deletions: the line before each (0: the top)
    tally: Tally
    killed_by_vllm: int = 0

    @property
    def group(self) -> str:
        """The region of the changed code outside every fence region, scored apart."""
        return OUTSIDE

    @property
    def line_count(self) -> int:
        return sum(last - first + 1 for first, last in self.lines)

    @property
    def renamed(self) -> bool:
        return bool(self.old_path) and self.old_path != self.path

    def described(self) -> str:
        """``HEAD~1 (1a2b3c4d5e6f)``."""
        return f"{self.ref} ({self.commit[:12]})"

    def lines_text(self, limit: int = 0) -> str:
        """``478 changed lines (5-6, 21-23, and 76 more); 12 pure deletions, ...``."""
        lines = self.line_count
        text = f"{lines} changed line{'' if lines == 1 else 's'} ({self.ranges_text(limit)})"
        if self.deletions:
            count = len(self.deletions)
            text += (
                f"; {count} pure deletion{'' if count == 1 else 's'}, each marking the lines "
                "on either side"
            )
        return text

    def ranges_text(self, limit: int = 0) -> str:
        """``3-4, 18, 30-41``; with ``limit``, the first ``limit`` runs and how many more."""
        shown = self.lines[:limit] if limit else self.lines
        text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in shown)
        more = len(self.lines) - len(shown)
        return f"{text}, and {more} more" if more else text


@dataclass(frozen=True, slots=True)
class FunctionTally:
    name: str
    tally: Tally
    killed_by_vllm: int

    @property
    def vllm_score(self) -> float | None:
        return Fraction(self.killed_by_vllm, self.tally.judged).percent


@dataclass(frozen=True, slots=True)
class ShardRecord:
    """One shard of a run dealt over ``count`` jobs (``mutate --shard K/N``): the file
    holds only the mutants dealt to it; ``fence-audit merge`` puts the run together."""

    index: int
    count: int
    mutants: tuple[str, ...]  # the ids dealt to this shard
    run: tuple[str, ...]  # every mutant id of the run, in its order
    equivalents: tuple[str, ...]  # the ids of the run's equivalents records, in order
    costs: str  # the digest of the test durations the mutants were dealt by

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def described(self) -> str:
        """``shard 2 of 4: 55 of the run's 221 mutants``."""
        return (
            f"shard {self.index} of {self.count}: {len(self.mutants)} of the run's "
            f"{len(self.run)} mutants"
        )


@dataclass(frozen=True, slots=True)
class AuditResults:
    path: Path
    tool_version: str
    vllm_version: str
    target_module: str
    target_path: str
    target_sha256: str
    suite_origin: str
    suite_paths: tuple[str, ...]
    engine: str
    started_at: str
    duration_s: float
    overall: Tally
    regions: tuple[RegionResult, ...]
    mutants: tuple[MutantRecord, ...]
    functions: tuple[SourceFunction, ...]
    out_of_region: int
    catalogue: tuple[CatalogueRecord, ...] = ()
    overall_killed_by_vllm: int = 0
    equivalents: tuple[EquivalentRecord, ...] = ()
    tool_name: str = "fence-audit"
    # An interrupted run: (mutants judged, of how many); the file holds only those judged.
    incomplete: tuple[int, int] | None = None
    since: ChangeRecord | None = None  # a pull-request run (--since REF)
    findings: tuple[FindingRecord, ...] = ()  # real vLLM bugs of this release
    scope: str = "regions"  # "file": every mutant of the module (audit.mutation.scope)
    shard: ShardRecord | None = None  # one shard of a run (mutate --shard K/N)
    random_workloads: tuple[str, ...] = ()  # measured alone (--random-alone); () if not
    deep_look: tuple[str, float] | None = None  # (profile, seconds) of --deep; None: not run

    @property
    def vllm_score(self) -> float | None:
        """The overall score vLLM's suite alone earns (see RegionResult.vllm_score)."""
        return Fraction(self.overall_killed_by_vllm, self.overall.judged).percent

    @property
    def killed_by_random(self) -> int | None:
        """The fence mutants the random workloads alone killed (None: not measured)."""
        if not self.random_workloads:
            return None
        return sum(m.killed_by_random for m in self.mutants if m.region not in APART)

    @property
    def random_score(self) -> float | None:
        """The overall score of the random workloads alone (None: not measured)."""
        killed = self.killed_by_random
        return None if killed is None else Fraction(killed, self.overall.judged).percent

    @property
    def interrupted(self) -> str:
        """What the reports' banner says of an interrupted run; "" for a complete one."""
        if self.incomplete is None:
            return ""
        judged, total = self.incomplete
        return f"the run was interrupted after {judged} of {total} mutants"

    def stale(self) -> tuple[CatalogueRecord, ...]:
        return tuple(c for c in self.catalogue if c.stale)

    def carried(self) -> tuple[CatalogueRecord, ...]:
        """The catalogue's bugs that this release already has."""
        return tuple(c for c in self.catalogue if c.state == "carried")

    def region(self, name: str) -> RegionResult:
        return next(r for r in self.regions if r.name == name)

    def mutants_of(self, region: str) -> tuple[MutantRecord, ...]:
        return tuple(m for m in self.mutants if m.region == region)

    def by_function(self, region: str) -> tuple[FunctionTally, ...]:
        """The tally of each function's mutants in ``region``, recomputed; in file order.
        For the groups outside the fence (--scope file), which are read by function."""
        order = {f.name: f.start for f in self.functions}
        grouped: dict[str, list[MutantRecord]] = {}
        for mutant in self.mutants_of(region):
            grouped.setdefault(mutant.function, []).append(mutant)
        return tuple(
            FunctionTally(name, *tally_of(mutants))
            for name, mutants in sorted(grouped.items(), key=lambda i: (order.get(i[0], 0), i[0]))
        )

    def survivors(self) -> tuple[MutantRecord, ...]:
        return tuple(m for m in self.mutants if m.status is MutantStatus.SURVIVED)


def tally_of(mutants: Sequence[MutantRecord]) -> tuple[Tally, int]:
    """The tally of ``mutants`` and how many of them vLLM's own tests killed."""
    by_vllm = sum(killed_by_vllm(m.status, m.killed_by) for m in mutants)
    return Tally.of(m.status for m in mutants), by_vllm

"""Second judgements: each mutant judged again by one part of the suite alone.

``mutate --random-alone`` asks what the suite's random workloads (the configured
``[tool.fence-audit.suite] random-workloads``: this project's stateful machine) kill
without any targeted test beside them. Every mutant of the fence regions, mutmut's
and the catalogue's, is judged a second time with only those of its covering tests
that are random workloads; a mutant none of them reaches is ``no_tests`` there.

The second judgement is an ordinary job of the executor: the same mutant under an
id of its own (``ID~random-PROFILE``) whose covering tests are the workloads alone. Its
verdict is cached under its own key (the key holds the covering tests), so a second
run judges nothing again; it never changes the mutant's own verdict or the score,
and is reported beside them (audit.json's ``random``, the reports' "random
workloads alone" column), tallied from the mutants on every read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from audit.core.protocol import PROJECT_PREFIX, MutantStatus
from audit.mutation.scope import APART
from audit.setup.config import SuitePath
from audit.setup.model import Mutant, MutantResult

RANDOM = "random"
SUFFIX = "~" + RANDOM
# the statuses a score counts (killed / (killed + survived + timeout))
SCORED = frozenset({MutantStatus.KILLED, MutantStatus.SURVIVED, MutantStatus.TIMEOUT})


@dataclass(frozen=True, slots=True)
class Workloads:
    """The tests that are random workloads, by test id or file (``project:`` or
    ``vllm:`` paths, as the suite's)."""

    selectors: tuple[SuitePath, ...]
    # the Hypothesis profile they run under for this measure ("": their own default);
    # the default, dev, is the ci programs without shrinking: the same kills, and no
    # time spent shrinking an example nobody reads
    profile: str = ""

    @property
    def suffix(self) -> str:
        """What a second judgement's id adds to the mutant's: the profile is part of
        it, so that a verdict cached under another profile is not reused."""
        return SUFFIX + (f"-{self.profile}" if self.profile else "")

    def environment(self) -> dict[str, str]:
        return {"HYPOTHESIS_PROFILE": self.profile} if self.profile else {}

    def test_ids(self) -> tuple[str, ...]:
        """The selectors as test id prefixes."""
        return tuple(
            (PROJECT_PREFIX if s.root == "project" else "") + s.path for s in self.selectors
        )

    def holds(self, test_id: str) -> bool:
        for prefix in self.test_ids():
            if test_id == prefix or test_id.startswith((prefix + "::", prefix + "[")):
                return True
        return False


def second_judgements(mutants: Iterable[Mutant], workloads: Workloads) -> tuple[Mutant, ...]:
    """Each fence mutant again, under its own id, covered by the random workloads alone."""
    return tuple(
        dataclasses.replace(
            mutant,
            id=mutant.id + workloads.suffix,
            covered_by=tuple(t for t in mutant.covered_by if workloads.holds(t)),
        )
        for mutant in mutants
        if mutant.region not in APART
    )


def split(
    verdicts: Mapping[str, MutantResult],
) -> tuple[dict[str, MutantResult], dict[str, MutantResult]]:
    """The mutants' own verdicts, and the second judgements' by the mutant's id."""
    own = {k: v for k, v in verdicts.items() if SUFFIX not in k}
    second = {
        k.split(SUFFIX)[0]: dataclasses.replace(v, id=k.split(SUFFIX)[0])
        for k, v in verdicts.items()
        if SUFFIX in k
    }
    return own, second


def killed(status: MutantStatus, second: MutantStatus | None) -> bool:
    """Killed by the random workloads alone: the mutant counts in the score (killed,
    survived or timeout) and its second judgement killed it."""
    return status in SCORED and second is MutantStatus.KILLED

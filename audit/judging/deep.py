"""The deep second look: every survivor judged again by the random workloads, longer.

The suite's random workloads run in every judgement under a small budget (the ``ci``
profile). A mutant that survives them may still be found by a longer search: ``mutate
--deep`` judges each survivor of the fence regions a second time with only the random
workloads (``suite.random-workloads``), under the Hypothesis profile ``deep.profile``
(set in the judging fork's ``HYPOTHESIS_PROFILE``), for at most ``deep.seconds`` of
CPU time per mutant (the test's budget, :mod:`audit.testproc.judge`).

Its outcomes: killed (the search found a failure; the verdict keeps Hypothesis' whole
falsifying example, which the reports turn into a regression test to paste),
timeout (nothing found within the time box), survived (the profile's every example
ran without a failure), no tests (the workloads never reach the mutant). The
mutant's own verdict and the score do not change: the score is the suite's, and a
time-boxed search is not part of the suite. The profile should be derandomized, as
``deep`` is: the same search every run, so its verdict is cached like any other (the
job's id holds the profile and the seconds, so changing either judges again).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from audit.core.protocol import EXAMPLE, MutantStatus
from audit.judging.alone import Workloads
from audit.judging.jobs import ExecutorOptions
from audit.mutation.scope import APART
from audit.setup.config import DeepLook
from audit.setup.model import Mutant, MutantResult

PROFILE_ENV = "HYPOTHESIS_PROFILE"
MARK = "~deep"


# What a deep verdict other than a kill says, in the reports' words.
OUTCOMES = {
    MutantStatus.TIMEOUT: "nothing found within the time box",
    MutantStatus.SURVIVED: "nothing found: the profile ran every example",
    MutantStatus.NO_TESTS: "the random workloads never reach this mutant",
    MutantStatus.ERROR: "could not be judged",
}


def found(mutant: object) -> bool:
    """A survivor the deep second look killed (a report record with ``deep``)."""
    look = getattr(mutant, "deep", None)
    return look is not None and look.status is MutantStatus.KILLED


def deep_id(mutant_id: str, look: DeepLook) -> str:
    return f"{mutant_id}{MARK}-{look.profile}-{look.seconds:g}s"


def second_looks(
    mutants: Sequence[Mutant],
    verdicts: Mapping[str, MutantResult],
    workloads: Workloads,
    look: DeepLook,
) -> tuple[Mutant, ...]:
    """Each survivor of the fence regions, under its deep id, covered by the random
    workloads alone (a reviewed equivalent is no survivor: it is not looked at)."""
    return tuple(
        dataclasses.replace(
            mutant,
            id=deep_id(mutant.id, look),
            covered_by=tuple(t for t in mutant.covered_by if workloads.holds(t)),
        )
        for mutant in mutants
        if mutant.region not in APART and verdicts[mutant.id].status is MutantStatus.SURVIVED
    )


def options(look: DeepLook, base: ExecutorOptions) -> ExecutorOptions:
    """The executor's options for the deep jobs: each test's budget is the time box,
    and one hang (the box spent) ends the judgement."""
    return dataclasses.replace(base, timeout_factor=0.0, timeout_min_s=look.seconds, max_hangs=1)


def environment(look: DeepLook) -> dict[str, str]:
    return {PROFILE_ENV: look.profile}


def by_mutant(
    verdicts: Mapping[str, MutantResult], looked: Sequence[Mutant], look: DeepLook
) -> dict[str, MutantResult]:
    """The deep verdicts by the mutant's own id."""
    suffix = deep_id("", look)
    return {
        m.id.removesuffix(suffix): dataclasses.replace(verdicts[m.id], id=m.id.removesuffix(suffix))
        for m in looked
    }


_STEP = re.compile(r"^\s*state(\s*=\s*\w+\(\)|\.\w+\(.*\))\s*$")


def regression_test(failure: str, mutant_id: str, test_id: str, vllm_version: str = "") -> str:
    """Hypothesis' falsifying example of a stateful test (``test_id`` found it), as a
    pytest test to paste beside the state machine's module; "" when there is none."""
    lines = failure.splitlines()
    start = next((i for i, line in enumerate(lines) if EXAMPLE.match(line)), None)
    if start is None:
        return ""
    steps: list[str] = []
    for line in lines[start:]:
        if _STEP.match(line):  # draws of st.data() and notes between them are left out
            steps.append(line.strip())
            if steps[-1] == "state.teardown()":
                break
    if not steps or "=" not in steps[0]:
        return ""
    machine = steps[0].split("=", 1)[1].strip().removesuffix("()")
    module = test_id.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    slug = re.sub(r"[^0-9a-zA-Z]+", "_", mutant_id).strip("_").lower()[:60]
    body = "\n".join(f"    {step}" for step in steps)
    release = f" (vLLM {vllm_version})" if vllm_version else ""
    return (
        f"def test_found_by_the_deep_look_{slug}() -> None:\n"
        f'    """The deep second look\'s example on mutant {mutant_id}{release}."""\n'
        f"    from {module} import {machine}\n\n"
        f"{body}\n"
    )

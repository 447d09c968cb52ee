"""A run's mutants judged: by the fork engine, with the second looks asked for, or by
mutmut's own runner.

The fork engine (:mod:`audit.judging.executor`) judges every mutant, and with
``--random-alone`` each fence mutant again by the random workloads alone
(:mod:`audit.judging.alone`); ``--deep`` then gives each survivor of the fence a longer
search (:mod:`audit.judging.deep`). An interrupted run keeps the verdicts so far.
``--engine mutmut`` hands mutmut's mutants to ``mutmut run`` instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from audit.core.protocol import MutantStatus
from audit.judging import alone, deep, executor
from audit.judging.jobs import ExecutorOptions
from audit.mutation.run_mutants import PreparedRun
from audit.setup.model import CoverageMap, Mutant, MutantResult
from audit.setup.session import WarmSession
from audit.setup.suite import Suite


class CoverageRun(Protocol):
    """What judging reads of a run's coverage stage (:class:`audit.pipeline.CoverageStage`,
    which this layer cannot import)."""

    @property
    def prepared(self) -> PreparedRun: ...
    @property
    def suite(self) -> Suite: ...
    @property
    def coverage_map(self) -> CoverageMap: ...
    @property
    def warm(self) -> WarmSession | None: ...
    def close(self) -> None: ...


def judge_mutants(
    stage: CoverageRun,
    mutants: tuple[Mutant, ...],
    hashes: Mapping[str, str],
    options: ExecutorOptions,
    engine: str,
    random_alone: bool,
) -> tuple[
    dict[str, MutantResult],
    dict[str, MutantResult] | None,
    tuple[int, int] | None,
    tuple[Mutant, ...],
]:
    """The verdicts, the random workloads' second judgements (None unless asked for
    and whole), (judged, of) for an interrupted run, and the mutants judged."""
    prepared = stage.prepared
    config = prepared.config
    if engine == "mutmut":
        return _judge_with_mutmut(stage, mutants, options), None, None, mutants
    incomplete: tuple[int, int] | None = None
    random: dict[str, MutantResult] | None = None
    # --random-alone: the second judgements are more jobs of the same executor.
    workloads = alone.Workloads(config.random_workloads, config.random_profile)
    seconds = alone.second_judgements(mutants, workloads) if random_alone else ()
    try:
        verdicts = executor.judge(
            config,
            stage.suite,
            prepared.target,
            (*mutants, *seconds),
            hashes,
            stage.coverage_map.durations,
            prepared.vllm.version,
            options,
            stage.warm,
            # Every judgement runs the random workloads under their judging profile
            # (no shrinking): a kill is their first failure, and shrinking it cost
            # a mutant of the pull-request audit its verdict (the backstop, 60 s).
            env=dict.fromkeys((m.id for m in (*mutants, *seconds)), workloads.environment()),
        )
    except executor.Interrupted as interrupted:
        # The results so far are written, marked incomplete (only the mutants
        # judged, every tally recomputed from them); the cache resumes the rest.
        verdicts = interrupted.verdicts
        own = {k for k in verdicts if alone.SUFFIX not in k}
        judged = tuple(m for m in mutants if m.id in own)
        incomplete = (len(judged), len(mutants))
        mutants = judged
    verdicts, second = alone.split(verdicts)
    if random_alone and incomplete is None:  # an interrupted run's would be partial
        random = second
    return verdicts, random, incomplete, mutants


def deep_look(
    stage: CoverageRun,
    mutants: tuple[Mutant, ...],
    hashes: Mapping[str, str],
    verdicts: Mapping[str, MutantResult],
    options: ExecutorOptions,
) -> tuple[dict[str, MutantResult] | None, bool]:
    """``--deep``: the deep verdicts of the fence's survivors, by mutant id; and
    whether it was interrupted (then None: a part would pass for the whole)."""
    prepared = stage.prepared
    config = prepared.config
    look = config.deep
    looked = deep.second_looks(mutants, verdicts, alone.Workloads(config.random_workloads), look)
    if not looked:
        return {}, False
    print(
        f"fence-audit: deep second look at {len(looked)} survivors: the random workloads "
        f"under profile {look.profile!r}, up to {look.seconds:g} s of CPU each"
    )
    try:
        found = executor.judge(
            config,
            stage.suite,
            prepared.target,
            looked,
            hashes,
            stage.coverage_map.durations,
            prepared.vllm.version,
            deep.options(look, options),
            None,
            env=dict.fromkeys((m.id for m in looked), deep.environment(look)),
            whole_failure=True,
        )
    except executor.Interrupted:
        return None, True  # the deep verdicts so far are cached: the next run resumes
    return deep.by_mutant(found, looked, look), False


def _judge_with_mutmut(
    stage: CoverageRun, mutants: Sequence[Mutant], options: ExecutorOptions
) -> dict[str, MutantResult]:
    """``--engine mutmut``: mutmut's own runner judges its mutants; it cannot apply
    the catalogue's, which are errors."""
    stage.close()
    from audit.mutation import mutmut_adapter  # libcst and mutmut: imported when used

    prepared = stage.prepared
    own = tuple(m for m in mutants if m.origin != "catalogue")
    verdicts = mutmut_adapter.judge(
        prepared.config, stage.suite, prepared.target, own, options.jobs
    )
    for mutant in mutants:
        if mutant.origin == "catalogue":
            verdicts[mutant.id] = MutantResult(
                mutant.id, MutantStatus.ERROR, failure="catalogue entries need --engine fork"
            )
    return verdicts

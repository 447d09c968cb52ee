"""The audit's stages, in order. This is the one place that lists them.

    config -> source (vLLM package + its tests) -> regions -> baseline under coverage
           -> mutants -> execute -> results -> reports -> gate

- :func:`prepare`: config, source, regions (and the catalogue, the equivalents);
- :func:`coverage`: the baseline under coverage; coverage map, regions.json, its HTML;
- :func:`mutate`: mutants, execute, results (``audit.json``); with a shard, only the
  mutants dealt to it;
- :func:`merge`: one run's ``audit.json`` from its shards' (instead of ``mutate``);
- :func:`report`: every report, rendered from a saved ``audit.json`` alone;
- :func:`gate`: the thresholds against a saved ``audit.json``.

Each stage is a plain function of another module; this module only wires them.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from audit.baseline import coverage_map
from audit.baseline.cache import BaselineCache, baseline_inputs
from audit.baseline.coverage_map import HtmlInBackground
from audit.baseline.run import cached_baseline, start_baseline
from audit.core import cache, environment, outputs
from audit.core.environment import Fingerprint
from audit.core.errors import ConfigError, RunInterrupted
from audit.core.files import write_json
from audit.judging.jobs import ExecutorOptions
from audit.judging.run import deep_look, judge_mutants
from audit.mutation import changes
from audit.mutation import scope as scopes
from audit.mutation.catalogue_entries import Entry, load_catalogue
from audit.mutation.catalogue_mutants import CatalogueMutants
from audit.mutation.equivalents import (
    Equivalent,
    apply_equivalents,
    listed_records,
    load_equivalents,
)
from audit.mutation.mutants import MutantSet
from audit.mutation.run_mutants import (
    catalogue_mutants,
    function_hashes_of,
    mutmut_mutants,
    prime_mutations,
    run_regions,
)
from audit.rendering.reports import Written, write_reports
from audit.results import scores as results
from audit.results import shards
from audit.results.gate import GateResult, check_region_names, evaluate
from audit.results.merge import merged_results
from audit.results.report_model import load_results
from audit.results.scores import Tally
from audit.results.shards import Shard, ShardPlan
from audit.results.view import AuditResults
from audit.setup import sources
from audit.setup.config import Config, GateThresholds, SuitePath
from audit.setup.findings import Finding, load_findings
from audit.setup.model import (
    BaselineRun,
    CoverageMap,
    Mutant,
    MutantResult,
    RegionCoverage,
    Target,
)
from audit.setup.regions import Region, resolve_regions
from audit.setup.session import WarmSession
from audit.setup.sources import TestSource
from audit.setup.suite import Suite, stage_suite


@dataclass(frozen=True, slots=True)
class Prepared:
    """Everything known before a test runs: nothing of it writes a report."""

    config: Config
    vllm: environment.InstalledVllm
    source: TestSource
    target: Target
    regions: tuple[Region, ...]
    before: Fingerprint
    catalogue: tuple[Entry, ...] = ()
    equivalents: tuple[Equivalent, ...] = ()
    # Pull-request mode (--since): what changed in the target; ``regions`` then ends
    # with the group of the changed code outside every region (changes.OUTSIDE).
    changed: changes.ChangedCode | None = None
    findings: tuple[Finding, ...] = ()  # real vLLM bugs, by release (docs/findings.toml)
    scope: str = scopes.REGIONS  # which of mutmut's mutants: the regions', or the file's


@dataclass(frozen=True, slots=True)
class CoverageStage:
    prepared: Prepared
    suite: Suite
    run: BaselineRun
    coverage_map: CoverageMap
    regions: tuple[RegionCoverage, ...]
    after: Fingerprint
    warm: WarmSession | None  # the baseline's process, kept for the mutants; close it
    # the coverage HTML, rendered while the mutants are judged; in place once closed
    html: HtmlInBackground | None = None
    reused: bool = False  # read from the baseline cache: no test process ran
    why: tuple[str, ...] = ()  # the inputs that changed since the last run kept, if it ran
    rerun: tuple[str, ...] = ()  # the test files it ran when only they changed (the rest kept)

    def close(self) -> None:
        try:
            if self.warm is not None:
                self.warm.close()
        finally:
            if self.html is not None:
                self.html.finish()


@dataclass(frozen=True, slots=True)
class Looks:
    """The second looks a run adds to its verdicts: each fence mutant by the random
    workloads alone (:mod:`audit.judging.alone`), each survivor by a longer search of theirs
    (:mod:`audit.judging.deep`)."""

    random_alone: bool = False
    deep: bool = False


@dataclass(frozen=True, slots=True)
class MutationStage:
    coverage: CoverageStage
    mutant_set: MutantSet  # mutmut's
    catalogue: CatalogueMutants
    mutants: tuple[Mutant, ...]  # all judged: mutmut's in-region ones, then the catalogue's
    verdicts: dict[str, MutantResult]
    tallies: dict[str, Tally]
    overall: Tally
    duration_s: float
    after: Fingerprint
    shard: ShardPlan | None = None  # --shard K/N: ``mutants`` are those dealt to it


def prepare(
    config: Config,
    *,
    vllm_src: Path | None = None,
    writes_reports: bool = True,
    since: str | None = None,
    scope: str = scopes.REGIONS,
) -> Prepared:
    """``writes_reports``: the command writes to the reports folder, which must then be
    writable and hold nothing fence-audit did not write (checked first, writing nothing).
    ``since``: a git ref of the ``vllm_src`` checkout; only the target's code changed
    since then is audited (pull-request mode). ``scope``: :data:`scopes.FILE` adds
    the group of every function's code outside the regions (:mod:`audit.mutation.scope`)."""
    if writes_reports:
        outputs.check_reports_dir(config.reports_dir)
    # The project's own files first: a broken one costs no download.
    entries, equivalents = load_entries(config), load_equivalents(config.equivalents_file)
    vllm = environment.installed_vllm(config.vllm_version, config.vllm_version_from)
    before = environment.verify_untouched(vllm, config.target)
    cache.mark(config.cache_dir)  # every check passed: the run's first write there
    if vllm_src is not None:
        source = sources.checkout_source(vllm_src, config.target)
    else:
        source = sources.sdist_tests(
            vllm.version,
            index_url=config.index_url,
            cache_dir=config.cache_dir,
            version_from=config.vllm_version_from,
        )
    path = source.target_file(config.target) or before.path
    text = path.read_text(encoding="utf-8")
    target = Target(
        module=config.target,
        path=path,
        installed_path=before.path,
        sha256=environment.sha256_file(path),
    )
    regions = resolve_regions(text, config.regions, filename=str(path), version=vllm.version)
    changed = None
    if since is not None:
        relpath = environment.module_relpath(config.target)
        changed = changes.changed_since(source.root, since, relpath)
        regions = (*regions, changes.outside_group(changed, text, regions))
    if scope == scopes.FILE:
        regions = (*regions, scopes.outside_regions_group(text, regions))
    findings = load_findings(config.findings_file, config.project_dir)
    if writes_reports:  # every input checked: the run's first write to the folder
        outputs.hold(config.reports_dir)
    return Prepared(
        config,
        vllm,
        source,
        target,
        regions,
        before,
        entries,
        equivalents,
        changed,
        findings,
        scope,
    )


def load_entries(config: Config) -> tuple[Entry, ...]:
    """The catalogue, checked before anything runs: a broken entry costs no baseline."""
    folder = config.catalogue_dir
    if folder is None or not folder.is_dir():
        return ()
    entries = tuple(
        dataclasses.replace(e, module="") if e.module == config.target else e
        for e in load_catalogue(folder)
    )
    names = {region.name for region in config.regions}
    for entry in entries:
        if entry.region not in names:
            raise ConfigError(
                f"catalogue entry {entry.id!r} names region {entry.region!r}, which is not "
                "configured",
                details={
                    "file": str(entry.path),
                    "regions": ", ".join(sorted(names)),
                    "next": "set region to a configured one, or configure this region",
                },
            )
    return entries


def coverage(
    prepared: Prepared,
    suite_entries: tuple[SuitePath, ...] = (),
    *,
    reuse: bool = False,
    prime: bool = False,
    workers: int = 1,
) -> CoverageStage:
    """The baseline under coverage. ``reuse``: read it from the baseline cache when
    every input is as it was (no test process then starts); a run is kept there
    either way. ``prime``: mutants follow, so their generation is done while the
    test process starts (:func:`~audit.mutation.run_mutants.prime_mutations`).
    ``workers``: processes the baseline's tests are dealt to."""
    config = prepared.config
    work = outputs.scratch(config.reports_dir)
    outputs.claim(config.reports_dir, "logs/baseline.log")  # written by start_baseline
    suite = stage_suite(config, prepared.source, suite_entries or config.suite, work)
    cache = BaselineCache(config.cache_dir / "baselines")
    inputs = baseline_inputs(
        suite,
        prepared.target.path,
        prepared.target.sha256,
        prepared.vllm.version,
        config.findings_file,
        os.environ,
    )
    cached = cache.load(inputs) if reuse else None
    warm: WarmSession | None = None
    rerun = None
    version = prepared.vllm.version
    if cached is not None:
        run = cached_baseline(cached, config, prepared.target, work, prepared.findings, version)
        why: tuple[str, ...] = ()
    else:
        why = tuple(cache.changed_since_last(inputs)) if reuse else ("asked for a run",)
        rerun = cache.partial(inputs, suite) if reuse else None
        meanwhile = (lambda: prime_mutations(prepared)) if prime else None
        run, warm = start_baseline(
            config,
            suite,
            prepared.target,
            work,
            prepared.findings,
            version,
            meanwhile,
            workers,
            rerun,
        )
        cache.save(inputs, run, run.exit_code)
    try:
        after = environment.verify_untouched(prepared.vllm, config.target)
        cmap = coverage_map.build_coverage_map(run, prepared.vllm.version)
        regions = coverage_map.region_coverage(run, prepared.regions)
        html = None
        directory, kept = config.reports_dir / "coverage", cache.html_dir(inputs)
        if warm is not None and not kept.is_dir():  # mutants follow: render meanwhile
            html = coverage_map.HtmlInBackground(run, directory, kept, work)
        else:
            coverage_map.write_html(run, directory, kept)
        coverage_map.write_coverage_map(cmap, config.reports_dir / "coverage-map.json")
        coverage_map.write_regions(regions, run, config.reports_dir / "regions.json")
    except BaseException:
        if warm is not None:
            warm.close()
        raise
    return CoverageStage(
        prepared,
        suite,
        run,
        cmap,
        regions,
        after,
        warm,
        reused=cached is not None,
        why=why,
        rerun=rerun.files if rerun is not None else (),
        html=html,
    )


def mutate(
    stage: CoverageStage,
    options: ExecutorOptions,
    only: tuple[str, ...] = (),
    engine: str = "fork",
    shard: Shard | None = None,
    costs: Mapping[str, float] | None = None,
    looks: Looks = Looks(),
) -> MutationStage:
    """Judge the mutants of every region (or of the regions named in ``only``); with
    ``shard``, only those dealt to it (:mod:`audit.results.shards`), by the test durations
    ``costs`` (default: the baseline's); then the second ``looks`` asked for."""
    try:
        return _mutate(stage, options, only, engine, shard, costs, looks)
    finally:
        stage.close()


def _mutate(
    stage: CoverageStage,
    options: ExecutorOptions,
    only: tuple[str, ...],
    engine: str,
    shard: Shard | None,
    costs: Mapping[str, float] | None,
    looks: Looks,
) -> MutationStage:
    prepared = stage.prepared
    config = prepared.config
    for name in only:
        config.region(name)  # an unknown name is a ConfigError naming the known ones
    regions = run_regions(prepared, only)
    source = prepared.target.path.read_text(encoding="utf-8")
    mutant_set = mutmut_mutants(prepared, regions, source, stage.coverage_map.lines)
    others = {
        e.module: environment.installed_file(prepared.vllm, e.module)
        for e in prepared.catalogue
        if e.module and e.module != config.target
    }
    entries = catalogue_mutants(prepared, stage.coverage_map, regions, source, others)
    every_mutant = (*mutant_set.mutants, *entries.mutants)  # the run's
    hashes = function_hashes_of(source, every_mutant, others)
    # What this process judges: every mutant of the run, or those dealt to its shard.
    durations = stage.coverage_map.durations if costs is None else costs
    plan, mutants = _deal(shard, every_mutant, durations)
    log = "logs/mutmut.log" if engine == "mutmut" else "logs/mutants.log"
    outputs.claim(config.reports_dir, log, "audit.json")  # listed before they are written
    started = time.monotonic()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    verdicts, random, incomplete, mutants = judge_mutants(
        stage, mutants, hashes, options, engine, looks.random_alone
    )
    duration = time.monotonic() - started
    # Every mutant of the run, judged or not (an interrupted run's); and the regions it
    # left out (--region): records there say nothing about this run.
    left_out = tuple(r for r in prepared.regions if r not in regions)
    reviewed = prepared.equivalents
    if prepared.changed is not None:  # the run judged the changed code only
        ran = {m.id for m in every_mutant}
        reviewed = tuple(e for e in reviewed if any(s.id in ran for s in e.sites))
    verdicts, equivalence = apply_equivalents(
        every_mutant, verdicts, hashes, reviewed, left_out=left_out
    )
    deeper, stopped = None, False
    if looks.deep and incomplete is None:
        deeper, stopped = deep_look(stage, mutants, hashes, verdicts, options)
    after = environment.verify_untouched(prepared.vllm, config.target)
    names = [region.name for region in regions]
    marker = None
    if plan is not None:  # the records the whole run lists: merge restores their order
        marker = plan.marker(listed_records(every_mutant, hashes, reviewed, left_out=left_out))
    results.write_audit(
        config.reports_dir / "audit.json",
        target=prepared.target,
        vllm_version=prepared.vllm.version,
        suite={"tests_from": prepared.source.origin, "paths": list(stage.suite.selection)},
        engine=engine,
        mutants=mutants,
        verdicts=verdicts,
        catalogue=entries,
        equivalents=equivalence,
        out_of_region=mutant_set.out_of_region,
        regions=regions,
        coverage=stage.regions,
        coverage_map=stage.coverage_map,
        line_coverage=coverage_map.line_coverage(stage.run),
        started_at=started_at,
        duration_s=duration,
        incomplete=incomplete,
        since=changes.record(prepared.changed) if prepared.changed else None,
        findings=stage.run.findings,
        scope=prepared.scope,
        shard=marker,
        random=random,
        random_workloads=tuple(map(str, config.random_workloads)) if random else (),
        deep=deeper,
        deep_look=config.deep if deeper is not None else None,
    )
    if stopped:
        report(config, config.reports_dir / "audit.json")
        raise RunInterrupted(
            "interrupted during the deep second look: every verdict is in, the deep look's "
            "are left out",
            details={
                "results": f"{config.reports_dir / 'audit.json'} (without the deep look)",
                "next": "run `fence-audit mutate --deep` again: it resumes the deep look",
            },
        )
    if incomplete is not None:
        report(config, config.reports_dir / "audit.json")
        again = "fence-audit mutate" + (f" --shard {shard}" if shard else "")
        raise RunInterrupted(
            f"interrupted after {incomplete[0]} of {incomplete[1]} mutants had a verdict",
            details={
                "results": f"{config.reports_dir / 'audit.json'} (marked incomplete)",
                "next": f"run `{again}` again: it resumes from the verdicts so far",
            },
        )
    tallies = results.tally_by_region(mutants, verdicts, names)
    overall = Tally.of(verdicts[m.id].status for m in mutants if m.region not in scopes.APART)
    return MutationStage(
        stage, mutant_set, entries, mutants, verdicts, tallies, overall, duration, after, plan
    )


def _deal(
    shard: Shard | None, mutants: tuple[Mutant, ...], durations: Mapping[str, float]
) -> tuple[ShardPlan | None, tuple[Mutant, ...]]:
    """``--shard K/N``: its part of the run, and the mutants dealt to it; else all."""
    if shard is None:
        return None, mutants
    plan = shards.plan(shard, mutants, durations)
    dealt = set(plan.mutants)
    return plan, tuple(m for m in mutants if m.id in dealt)


def unchanged(
    prepared: Prepared,
    only: tuple[str, ...],
    suite_entries: tuple[SuitePath, ...] = (),
    shard: Shard | None = None,
) -> Path:
    """Pull-request mode when the target did not change: no baseline, no mutant;
    ``audit.json`` says what was compared, for the reports to say so (a shard's too:
    merge then puts together a run of no mutant)."""
    config = prepared.config
    assert prepared.changed is not None
    entries = suite_entries or config.suite
    path = config.reports_dir / "audit.json"
    outputs.claim(config.reports_dir, "audit.json")
    results.write_audit(
        path,
        target=prepared.target,
        vllm_version=prepared.vllm.version,
        suite={
            "tests_from": prepared.source.origin,
            "paths": [*(str(e) for e in entries), *(f"plugin {e}" for e in config.plugins)],
        },
        mutants=(),
        verdicts={},
        out_of_region=(),
        regions=run_regions(prepared, only),
        coverage=(),
        coverage_map=CoverageMap(prepared.target, prepared.vllm.version),
        line_coverage={},
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        duration_s=0.0,
        since=changes.record(prepared.changed),
        shard=None if shard is None else shards.plan(shard, (), {}).marker(()),
    )
    return path


def merge(config: Config, paths: Sequence[Path], thresholds: GateThresholds) -> Path:
    """One run's ``audit.json`` in the reports folder, from its shards' results at
    ``paths`` (:mod:`audit.results.merge`: each checked first; nothing is written if one is
    refused, nor if ``thresholds`` name a region neither configured nor merged). Then
    :func:`report` and :func:`gate`, as after :func:`mutate`."""
    outputs.check_reports_dir(config.reports_dir)
    path = config.reports_dir / "audit.json"
    document = merged_results(paths, path)
    known = {region.name for region in config.regions} | set(document["regions"])
    check_region_names(thresholds, known, path)
    outputs.hold(config.reports_dir)
    outputs.claim(config.reports_dir, "audit.json")
    write_json(path, document)
    return path


@dataclass(frozen=True, slots=True)
class ReportStage:
    results: AuditResults  # what every report rendered, and what the gate reads
    written: Written


def report(config: Config, path: Path, previous: AuditResults | None = None) -> ReportStage:
    """Render every report from the saved results at ``path`` (``previous``: an older
    run, for the changes in summary.md); nothing is re-run."""
    saved = load_results(path)
    outputs.check_reports_dir(config.reports_dir)
    outputs.hold(config.reports_dir)
    return ReportStage(saved, write_reports(saved, config.reports_dir, previous))


def gate(saved: AuditResults, thresholds: GateThresholds, config: Config) -> GateResult:
    """Check the saved results against ``thresholds``; a configured region the run
    left out (``--region``) is not checked, and neither is the overall score."""
    return evaluate(saved, thresholds, (region.name for region in config.regions))

"""The ``fence-audit`` command. The only place that catches :class:`AuditError`."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from audit import pipeline
from audit.arguments import build_parser
from audit.baseline.coverage_map import format_table
from audit.core import cache, environment, hermetic, outputs
from audit.core.errors import AuditError, ConfigError, ExitCode
from audit.core.files import write_text
from audit.core.inputs import check_cache_dir, resolved
from audit.core.text import first_of
from audit.judging.jobs import ExecutorOptions
from audit.mutation import catalogue, changes
from audit.mutation import scope as scopes
from audit.rendering.reports import Written
from audit.results import shards, standing
from audit.results.gate import GateResult
from audit.results.report_model import AuditResults, load_results
from audit.results.scores import Tally, format_scores
from audit.setup import sources
from audit.setup.config import (
    Config,
    GateThresholds,
    SuitePath,
    config_from_arguments,
    parse_suite_path,
    percentage,
)
from audit.setup.model import Mutant, MutantResult, percent_text
from audit.setup.regions import resolve_regions


def compared(path: Path) -> AuditResults:
    """The older run ``--compare`` names; a refusal says it is that option's file."""
    try:
        return load_results(path)
    except ConfigError as error:
        raise ConfigError(f"--compare: {error.summary}", details=error.details) from None


def thresholds(config: Config, args: argparse.Namespace) -> GateThresholds:
    """The configured gate, overridden by the command line."""
    gate = config.gate
    if args.fail_under is not None:
        gate = dataclasses.replace(
            gate, fail_under=percentage(args.fail_under, "--fail-under", "command line")
        )
    if args.min_line_coverage is not None:
        value = percentage(args.min_line_coverage, "--min-line-coverage", "command line")
        gate = dataclasses.replace(gate, min_line_coverage=value)
    regions = dict(gate.regions)
    for text in args.fail_under_region:
        name, sep, value = text.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not sep or not name or number is None:
            raise ConfigError(
                f"--fail-under-region {text!r} is not of the form NAME=PERCENT",
                details={"next": "for example --fail-under-region flush=90"},
            )
        regions[name] = percentage(number, f"--fail-under-region {name}", "command line")
    return dataclasses.replace(gate, regions=tuple(regions.items()))


def run(args: argparse.Namespace) -> ExitCode:
    config = config_from_arguments(args)
    if getattr(args, "no_catalogue", False):  # mutmut's mutants only
        config = dataclasses.replace(config, catalogue_dir=None)
    if args.command in ("report", "gate", "accept"):
        return from_results(config, args)
    if args.command == "merge":
        return merge(config, args)
    if args.command == "catalogue":
        return check_catalogue(config, args.vllm_src, args.release)
    if args.command == "cache":
        check_cache_dir(config.cache_dir, config.cache_dir_from, claim=False)
        return show_cache(config.cache_dir, args.prune, args.max_mb)
    # Every input is checked before the run: a bad one must not cost a download or a baseline.
    gate = thresholds(config, args) if args.command == "mutate" else None
    entries = check_inputs(config, args, gate)
    costs = shard_costs(args) if args.command == "mutate" else None
    previous = compared(args.compare) if getattr(args, "compare", None) else None
    writes = args.command not in ("fetch", "regions")  # these write nothing to the reports
    since = getattr(args, "since", None)
    prepared = pipeline.prepare(
        config,
        vllm_src=args.vllm_src,
        writes_reports=writes,
        since=since,
        scope=getattr(args, "scope", scopes.REGIONS),
    )
    print(f"fence-audit: vLLM {prepared.vllm.version}; tests from {prepared.source.origin}")
    print(f"fence-audit: target {prepared.target.module} ({prepared.target.path})")
    if prepared.changed is not None:
        print_changed(prepared.changed)
        if not prepared.changed.lines:
            return unchanged(prepared, args, entries, previous)
    if args.command == "fetch":
        print(f"fence-audit: vLLM's tests are in {prepared.source.root}")
        return ExitCode.OK
    if args.command == "regions":
        for region in prepared.regions:
            spans = ", ".join(f"{s.start}-{s.end}" for s in region.spans)
            print(f"{region.name:<16} {len(region.lines):>4} lines  {spans}")
        return ExitCode.OK

    mutating = args.command == "mutate"
    workers = getattr(args, "jobs", None) or os.cpu_count() or 1
    stage = baseline(
        prepared, entries, reuse=mutating and not args.no_cache, prime=mutating, workers=workers
    )
    reports = config.reports_dir
    if args.command == "coverage":
        stage.close()
    if args.command == "bench":
        from audit.devtools import bench

        try:
            result = bench.run_bench(
                stage,
                ExecutorOptions(jobs=args.jobs),
                tuple(args.region),
                args.sample,
                command=bench.mutate_command(args),
            )
        finally:
            stage.close()
        bench.write_bench(result, reports / "bench.json")
        print()
        print(bench.format_bench(result))
        print(f"\nfence-audit: benchmark in {reports / 'bench.json'}")
        return ExitCode.OK
    if args.command == "mutate":
        assert gate is not None
        return mutate(stage, args, gate, costs, previous)
    print(
        f"fence-audit: baseline green: {len(stage.run.tests)} tests in "
        f"{stage.run.duration_s:.1f}s (log: {stage.run.log})"
    )
    print(f"fence-audit: installed {stage.after.path.name} unchanged (sha256 {stage.after.sha256})")
    print(f"fence-audit: coverage HTML: {reports / 'coverage' / 'index.html'}")
    print(f"fence-audit: regions: {reports / 'regions.json'}; map: {reports / 'coverage-map.json'}")
    print()
    print(format_table(stage.regions))
    return ExitCode.OK


def mutate(
    stage: pipeline.CoverageStage,
    args: argparse.Namespace,
    gate: GateThresholds,
    costs: dict[str, float] | None,
    previous: AuditResults | None,
) -> ExitCode:
    """``mutate`` after the baseline: judge, write the reports, run the gate (a shard
    leaves the gate to ``merge``)."""
    config = stage.prepared.config
    options = ExecutorOptions(jobs=args.jobs, use_cache=not args.no_cache)
    looks = pipeline.Looks(random_alone=args.random_alone, deep=args.deep)
    stage_result = pipeline.mutate(
        stage, options, tuple(args.region), args.engine, args.shard, costs, looks
    )
    report_mutation(stage_result)
    reported = pipeline.report(config, config.reports_dir / "audit.json", previous)
    if args.shard is not None:
        print_shard(reported)
        return ExitCode.OK
    code = print_gate(pipeline.gate(reported.results, gate, config))
    print_report_and_gate(reported, code)
    return code


def baseline(
    prepared: pipeline.Prepared,
    entries: tuple[SuitePath, ...],
    *,
    reuse: bool,
    prime: bool = False,
    workers: int = 1,
) -> pipeline.CoverageStage:
    """The baseline stage; with ``reuse``, say whether it ran, and why: the inputs
    that changed since the last run kept. ``prime``: generate the mutants meanwhile.
    ``workers``: processes the baseline's tests are dealt to."""
    stage = pipeline.coverage(prepared, entries, reuse=reuse, prime=prime, workers=workers)
    if not reuse:
        return stage
    if stage.reused:
        print(
            f"fence-audit: baseline read from the cache: {len(stage.run.tests)} tests, every "
            "input unchanged (no test process started for it)"
        )
    elif stage.why:
        shown = "; ".join(stage.why[:6]) + (
            f"; and {len(stage.why) - 6} more" if len(stage.why) > 6 else ""
        )
        if stage.rerun:
            again = set(stage.rerun)
            ran = sum(t.test_id.partition("::")[0] in again for t in stage.run.tests)
            print(
                f"fence-audit: baseline ran again for {len(stage.rerun)} test file(s) only "
                f"({shown}): {ran} tests run, the other {len(stage.run.tests) - ran} read "
                "from the cache"
            )
        else:
            print(f"fence-audit: baseline ran again: {shown}")
    else:
        print("fence-audit: baseline ran: none kept for this selection yet")
    return stage


def check_inputs(
    config: Config, args: argparse.Namespace, gate: GateThresholds | None
) -> tuple[SuitePath, ...]:
    """What a run reads beyond the configuration, checked before it starts: region
    names (``--region``, the gate's), the cache folder, the offline models; returns
    the ``--suite`` selection, parsed."""
    configured = [region.name for region in config.regions]
    named = [("--region", name) for name in getattr(args, "region", [])]
    if getattr(args, "since", None) is not None:
        check_since(config, args)
        configured.append(changes.OUTSIDE)  # a gate threshold may name the group
    if getattr(args, "random_alone", False):
        check_random_alone(config, args, "--random-alone")
    if getattr(args, "deep", False):
        check_random_alone(config, args, "--deep")
    if getattr(args, "scope", scopes.REGIONS) == scopes.FILE:
        check_file_scope(config, args)
        configured.append(scopes.OUTSIDE_REGIONS)
    if gate is not None:
        given = {text.partition("=")[0] for text in args.fail_under_region}
        named += [
            (
                "--fail-under-region" if name in given else "[tool.fence-audit.gate] regions",
                name,
            )
            for name, _ in gate.regions
        ]
    for option, name in named:
        if name not in configured:
            raise ConfigError(
                f"{option} names region {name!r}, which is not configured",
                details={
                    "regions": ", ".join(configured),
                    "config": config.source,
                    "next": "use one of the regions above (fence-audit regions lists them)",
                },
            )
    entries = tuple(parse_suite_path(s) for s in getattr(args, "suite", []))
    check_cache_dir(config.cache_dir, config.cache_dir_from)
    hermetic.check_offline_models(config.offline_models)
    return entries


def check_random_alone(config: Config, args: argparse.Namespace, flag: str) -> None:
    """``--random-alone``, ``--deep``: second judgements by the random workloads."""
    if not config.random_workloads:
        raise ConfigError(
            f"{flag} needs the suite's random workloads, and none are configured",
            details={
                "config": config.source,
                "next": "list them in [tool.fence-audit.suite] random-workloads "
                f"(test ids or files, as 'project:PATH::TEST'), or drop {flag}",
            },
        )
    for option, given in (("--shard", args.shard), ("--engine mutmut", args.engine == "mutmut")):
        if given:
            raise ConfigError(
                f"{flag} and {option} do not go together",
                details={"next": f"ask for {flag} in a run without {option}"},
            )


def check_file_scope(config: Config, args: argparse.Namespace) -> None:
    """``--scope file``: every mutant of the module, what no region holds in a group."""
    if getattr(args, "since", None) is not None:  # bench has --scope but no --since
        raise ConfigError(
            "--scope file and --since do not go together: pull-request mode already judges "
            "the changed code outside the regions",
            details={"next": "drop --scope file (or --since, to audit the whole module)"},
        )
    if scopes.OUTSIDE_REGIONS in (region.name for region in config.regions):
        raise ConfigError(
            f"a configured region is named {scopes.OUTSIDE_REGIONS!r}, the name --scope file "
            "gives the code outside every region",
            details={"config": config.source, "next": "rename that region"},
        )


def shard_costs(args: argparse.Namespace) -> dict[str, float] | None:
    """``--shard-costs``: the test durations every shard deals by (read before the run)."""
    if args.shard_costs is None:
        return None
    if args.shard is None:
        raise ConfigError(
            "--shard-costs deals the mutants over shards: it needs --shard K/N",
            details={"next": "add --shard K/N, or drop --shard-costs"},
        )
    return shards.read_costs(args.shard_costs)


def check_since(config: Config, args: argparse.Namespace) -> None:
    """``--since``: pull-request mode compares a checkout's target with a git ref."""
    if args.vllm_src is None:
        raise ConfigError(
            f"--since {args.since} needs --vllm-src: the changes are read from a git checkout",
            details={
                "next": "add --vllm-src PATH (the root of the vLLM checkout holding the "
                "change), or drop --since to audit the whole fence",
            },
        )
    if changes.OUTSIDE in (region.name for region in config.regions):
        raise ConfigError(
            f"a configured region is named {changes.OUTSIDE!r}, the name --since gives the "
            "changed code outside every region",
            details={"config": config.source, "next": "rename that region"},
        )


def print_changed(changed: changes.ChangedCode) -> None:
    renamed = f", renamed from {changed.old_path}" if changed.renamed else ""
    new = "" if changed.old_path else " (new since then)"
    print(
        f"fence-audit: since {changed.describe()}: {len(changed.lines)} changed lines in "
        f"{changed.path}{new}{renamed}"
    )


def unchanged(
    prepared: pipeline.Prepared,
    args: argparse.Namespace,
    entries: tuple[SuitePath, ...],
    previous: AuditResults | None,
) -> ExitCode:
    """``--since`` and the target did not change: nothing to judge, no baseline; the
    reports say so (a PR comment posted from summary.md must not be an older run's)."""
    config = prepared.config
    path = pipeline.unchanged(prepared, tuple(args.region), entries, args.shard)
    written = pipeline.report(config, path, previous).written
    assert prepared.changed is not None
    print(
        f"fence-audit: nothing changed in {prepared.changed.path} since "
        f"{prepared.changed.describe()}: no mutant to judge; gate not checked"
    )
    print(f"fence-audit: report {written.index}; summary {written.summary}")
    return ExitCode.OK


def check_catalogue(config: Config, vllm_src: Path | None, release: str | None) -> ExitCode:
    """Apply every entry to the audited source: it must apply, compile and change the
    named function, or be carried (the release already has that code) or not yet
    (its ``since`` is later). No test runs, so this is quick enough for a pre-commit
    check; ``--release V`` checks vLLM V's sdist without installing it."""
    entries = pipeline.load_entries(config)
    version, read = _catalogue_source(config, vllm_src, release)
    path, source = read(config.target)
    print(
        f"fence-audit: catalogue {config.catalogue_dir}: {len(entries)} entries; "
        f"target {path} (vLLM {version})"
    )
    regions = resolve_regions(source, config.regions, filename=path, version=version)
    functions = {region.name: region.functions for region in regions}
    aliases = catalogue.function_aliases(config.regions)
    counts = {"ok": 0, "CARRIED": 0, "NOT YET": 0, "STALE": 0}
    width = max((len(e.id) for e in entries), default=0)
    for entry in entries:
        where, text = read(entry.module) if entry.module else (path, source)
        outcome = catalogue.apply_entry(entry, text, where, version=version, aliases=aliases)
        if isinstance(outcome, catalogue.Applied):  # its region's functions, or stale
            outcome = catalogue.outside_region(entry, outcome, functions[entry.region]) or outcome
        if isinstance(outcome, catalogue.Applied):
            state, why = "ok", f"{entry.region}, line {outcome.line}"
        elif isinstance(outcome, catalogue.Carried):
            state, why = "CARRIED", f"this release carries this bug: {outcome.reason}"
        elif isinstance(outcome, catalogue.NotYet):
            state, why = "NOT YET", outcome.reason
        else:
            state, why = "STALE", outcome.reason
        counts[state] += 1
        print(f"  {state:<7}  {entry.id:<{width}}  {why}")
    if not entries:
        print("fence-audit: the catalogue is empty")
    summary = ", ".join(f"{n} {k.lower()}" for k, n in counts.items() if n)
    if counts["STALE"]:
        print(f"fence-audit: {summary}; update the anchors of the STALE entries")
        return ExitCode.CATALOGUE_STALE
    print(f"fence-audit: {summary or 'nothing to check'}; no entry is stale")
    return ExitCode.OK


def _catalogue_source(
    config: Config, vllm_src: Path | None, release: str | None
) -> tuple[str, Callable[[str], tuple[str, str]]]:
    """The vLLM version checked, and how to read a module's file name and text: from
    ``--release``'s sdist, a checkout (its target; other modules installed), or the
    installed vLLM."""
    if release is not None:
        if vllm_src is not None:
            raise ConfigError(
                "--release and --vllm-src are two sources for the same code: give one",
                details={"next": "drop one of them"},
            )
        check_cache_dir(config.cache_dir, config.cache_dir_from)  # the sdist goes there
        cache.mark(config.cache_dir)

        def from_sdist(module: str) -> tuple[str, str]:
            text = sources.sdist_module(
                release,
                module,
                index_url=config.index_url,
                cache_dir=config.cache_dir,
                version_from="--release",
            )
            return f"vllm-{release}.tar.gz:{environment.module_relpath(module)}", text

        return release, from_sdist
    vllm = environment.installed_vllm(config.vllm_version, config.vllm_version_from)
    checkout = sources.checkout_source(vllm_src, config.target) if vllm_src else None

    def installed(module: str) -> tuple[str, str]:
        path = checkout.target_file(module) if checkout and module == config.target else None
        path = path or environment.installed_file(vllm, module)
        return str(path), path.read_text(encoding="utf-8")

    return vllm.version, installed


def from_results(config: Config, args: argparse.Namespace) -> ExitCode:
    """``report``, ``gate`` and ``accept``: they read a saved audit.json and run nothing."""
    if args.command == "accept":
        return accept(config, args)
    path = resolved(args.results or config.reports_dir / "audit.json", "--results")
    if args.command == "gate":
        gate = thresholds(config, args)
        results = load_results(path)
        if args.standing is not None:
            against = standing.path_for(args.standing, results.vllm_version)
            if against.is_file():
                return print_comparison(standing.compare(standing.load(against), results))
            proposed = propose_standing(config, results)
            print(
                f"fence-audit: no standing of vLLM {results.vllm_version} in {args.standing}: "
                f"the thresholds gate it; its first standing is proposed in {proposed}: "
                f"review it, then add it as {against} in a pull request"
            )
        return print_gate(pipeline.gate(results, gate, config))
    previous = compared(args.compare) if args.compare else None
    written = pipeline.report(config, path, previous).written
    print(f"fence-audit: report {written.index}; summary {written.summary}; {written.junit}")
    print_skipped(written)
    return ExitCode.OK


def accept(config: Config, args: argparse.Namespace) -> ExitCode:
    """``accept``: record the release's standing from a saved audit.json; a reason
    already recorded for a mutant left alive is kept unless ``--reason`` gives another."""
    path = resolved(args.results or config.reports_dir / "audit.json", "--results")
    results = load_results(path)
    previous = standing.path_for(args.standings, results.vllm_version)
    reasons = {}
    if previous.is_file():
        reasons = {k: v["reason"] for k, v in standing.load(previous).alive.items()}
    reasons.update(standing.parse_reasons(args.reason))
    accepted = standing.of_results(results, reasons)
    written = standing.record(args.standings, accepted)
    print(
        f"fence-audit: the standing of vLLM {accepted.vllm_version} is {written}: "
        f"{accepted.score.text()}, {len(accepted.alive)} accepted alive, "
        f"{len(accepted.findings)} findings; review it as a diff in a pull request"
    )
    return ExitCode.OK


def propose_standing(config: Config, results: AuditResults) -> Path:
    """The standing ``accept`` would record, written into the reports folder (so a CI
    artifact holds it); each mutant left alive awaits its reason."""
    alive = {m.id: standing.UNREVIEWED for m in results.mutants if m.status in standing.ALIVE}
    path = config.reports_dir / standing.PROPOSED
    outputs.check_reports_dir(config.reports_dir)
    outputs.hold(config.reports_dir)
    outputs.claim(config.reports_dir, standing.PROPOSED)
    write_text(path, standing.of_results(results, alive).to_json())
    return path


def print_comparison(comparison: standing.Comparison) -> ExitCode:
    """Print the comparison, add it to a GitHub job's summary, and give its exit code."""
    print(comparison.render())
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with Path(summary).open("a", encoding="utf-8") as handle:
            handle.write(comparison.markdown())
    return ExitCode.WORSE_THAN_STANDING if comparison.worse else ExitCode.OK


def merge(config: Config, args: argparse.Namespace) -> ExitCode:
    """``merge``: one run's audit.json from its shards', then the reports and the gate,
    as after ``mutate``; nothing runs."""
    gate = thresholds(config, args)
    previous = compared(args.compare) if args.compare else None
    path = pipeline.merge(config, tuple(args.shards), gate)
    print(f"fence-audit: merged {len(args.shards)} shards into {path}")
    reported = pipeline.report(config, path, previous)
    code = print_gate(pipeline.gate(reported.results, gate, config))
    print_report_and_gate(reported, code)
    return code


def show_cache(root: Path, prune_days: int | None, max_mb: int | None) -> ExitCode:
    """``fence-audit cache``: the cache's entries by kind; with ``--prune`` or
    ``--max-mb``, first remove those no run has used for that many days, then the
    least recently used until the cache holds at most that many megabytes."""
    if prune_days is not None or max_mb is not None:
        max_bytes = None if max_mb is None else max_mb * 1_000_000
        removed = cache.prune(root, prune_days, max_bytes=max_bytes)
        kinds = Counter(entry.kind for entry in removed)
        which = ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items()))
        why = []
        if prune_days is not None:
            days = f"{prune_days} day" if prune_days == 1 else f"{prune_days} days"
            why.append(f"no run has used for {days}")
        if max_mb is not None:
            why.append(f"least recently used beyond {max_mb} MB")
        print(
            f"fence-audit: pruned {_entries(len(removed))} ({' or '.join(why)}): "
            f"{cache.megabytes(removed)} MB" + (f" ({which})" if which else "")
        )
    held = cache.contents(root)
    print(
        f"fence-audit: cache {root}: {_entries(len(held.entries))}, "
        f"{cache.megabytes(held.entries)} MB"
    )
    if held.entries:
        print()
        print(cache.format_contents(held.entries))
    if held.foreign:
        names = first_of([str(p.relative_to(root)) for p in held.foreign], 3)
        print(
            f"fence-audit: {len(held.foreign)} paths in the cache are not fence-audit's, "
            f"left as they are: {names}"
        )
    return ExitCode.OK


def _entries(n: int) -> str:
    return f"{n} entry" if n == 1 else f"{n} entries"


def print_shard(reported: pipeline.ReportStage) -> None:
    """A shard's run ends without the gate: its score is of a part of the run."""
    shard = reported.results.shard
    assert shard is not None
    print_skipped(reported.written)
    print(
        f"fence-audit: report {reported.written.index}; {shard.described()}; gate not "
        "checked: `fence-audit merge` every shard's audit.json, then the gate runs on the run"
    )


def print_skipped(written: Written) -> None:
    for name, reason in written.skipped.items():
        print(f"fence-audit: {name} not written: {reason}")


def print_report_and_gate(reported: pipeline.ReportStage, code: ExitCode) -> None:
    verdict = {
        ExitCode.OK: "gate passed",
        ExitCode.TIMEOUTS_ONLY: "gate failed on timeouts only (exit 3)",
    }.get(code, "gate FAILED (exit 2)")
    overall = reported.results.overall
    print_skipped(reported.written)
    print(
        f"fence-audit: report {reported.written.index}; score {percent_text(overall.score)} "
        f"({overall.killed} killed of {overall.judged} judged); {verdict}"
    )


def print_gate(outcome: GateResult) -> ExitCode:
    """The gate's checks, printed; its exit code returned."""
    skipped = outcome.not_run or outcome.overall_skipped
    if outcome.checks or skipped or outcome.unchanged or outcome.overall_unchanged:
        print(outcome.render())
    else:
        print("fence-audit: gate: no threshold configured; nothing to check")
    return outcome.exit_code


def judged_counts(
    mutants: Iterable[Mutant], verdicts: Mapping[str, MutantResult]
) -> tuple[int, int, int]:
    """(judged in this run, verdicts from the cache, reached by no test) of ``mutants``.

    Judging is for the mutants some test reaches; one that no test reaches may still
    have a verdict other than no-tests (a reviewed equivalent of dead code), but no
    test ran for it, in this run or any other."""
    reached = [verdicts[m.id] for m in mutants if m.covered_by]
    cached = sum(v.cached for v in reached)
    return len(reached) - cached, cached, sum(not m.covered_by for m in mutants)


def report_mutation(stage: pipeline.MutationStage) -> None:
    reports = stage.coverage.prepared.config.reports_dir
    judged, from_cache, unreached = judged_counts(stage.mutants, stage.verdicts)
    count = len(stage.mutant_set.mutants)
    if stage.coverage.prepared.changed is not None:
        mutmut = f"{count} changed-code mutmut mutants"
    elif stage.coverage.prepared.scope == scopes.FILE:
        mutmut = f"{count} mutmut mutants of the whole module"
    else:
        mutmut = f"{count} in-region mutmut mutants"
    print(
        f"fence-audit: {mutmut} and "
        f"{len(stage.catalogue.mutants)} catalogue entries "
        f"({len(stage.mutant_set.out_of_region)} mutmut mutants outside every region, not run; "
        f"{unreached} reached by no test); judged {judged}, "
        f"from cache {from_cache}, in {stage.duration_s:.1f}s"
    )
    if stage.shard is not None:
        plan = stage.shard
        print(
            f"fence-audit: shard {plan.shard}: {len(plan.mutants)} of the run's "
            f"{len(plan.run)} mutants, dealt by predicted cost; the counts below are this "
            "shard's"
        )
    print(f"fence-audit: installed {stage.after.path.name} unchanged (sha256 {stage.after.sha256})")
    changed = stage.coverage.prepared.changed
    if changed is not None:
        tally = Tally.of(stage.verdicts[m.id].status for m in stage.mutants)
        outside = sum(m.region == changes.OUTSIDE for m in stage.mutants)
        print(
            f"fence-audit: changed code since {changed.describe()}: {tally.killed} of "
            f"{tally.judged} judged mutants killed ({percent_text(tally.score)}); "
            f"{len(stage.mutants)} mutants on changed lines, {outside} of them outside "
            f"every region ({changes.OUTSIDE}, scored apart)"
        )
    survivors = [m for m in stage.mutants if stage.verdicts[m.id].status == "survived"]
    for mutant in survivors:
        print(f"  survived: {mutant.id}  ({mutant.region}, line {mutant.line})")
    for stale in stage.catalogue.stale:
        print(f"  STALE: catalogue:{stale.entry.id}  {stale.reason}")
    print()
    print(format_scores(stage.tallies, stage.overall))
    print(f"\nfence-audit: results in {reports / 'audit.json'}")


# The modules whose code the interpreter runs as a weak reference's callback (a WeakSet
# dropping a collected member, weakref.finalize): a finalizer, as __del__ is.
_WEAKREF_FILES = frozenset({"weakref.py", "_weakrefset.py"})


def _in_finalizer(frame: FrameType | None) -> bool:
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or Path(code.co_filename).name in _WEAKREF_FILES:
            return True
        frame = frame.f_back
    return False


def _stop(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C, and SIGTERM (a cancelled CI job), stop the run. One that lands while an
    object is being finalized (a collected ``Popen``, say, or a weak reference's
    callback, such as a WeakSet dropping a collected member) would be swallowed there,
    Python printing "Exception ignored in ..." with a traceback, and the run would go
    on: it is delivered again a moment later, outside the finalizer."""
    if _in_finalizer(frame):
        again = threading.Timer(0.01, signal.raise_signal, (signum,))
        again.daemon = True
        again.start()
        return
    raise KeyboardInterrupt


def entry() -> int:
    """The ``fence-audit`` program: :func:`main`, with Ctrl-C kept out of finalizers,
    then no more interrupts. One that lands once the run is over (its results and
    reports written) would only interrupt Python's shutdown; the run's exit code
    stands."""
    signal.signal(signal.SIGINT, _stop)
    try:
        return main()
    finally:  # a timer's delivery still pending is ignored too
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; an option the command does not know is named with the command
    (argparse's own message names only the program)."""
    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    if given and given[0].startswith("-") and given[0] not in ("-h", "--help", "--version"):
        parser.error(f"unknown argument {given[0]} before the command")  # not "COMMAND required"
    args, unknown = parser.parse_known_args(given)
    if unknown:
        command = f"fence-audit {args.command}"
        raise ConfigError(
            f"{args.command}: unknown argument{'s' * (len(unknown) > 1)} {' '.join(unknown)}",
            details={"next": f"`{command} --help` lists its options"},
        )
    return args


class _OutputReaderGone:
    """Standard output that outlives its reader: once the pipe is closed
    (``fence-audit mutate | head -1``), what follows is dropped and the run goes on to
    write its verdicts and reports, instead of stopping at the next print."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self.stream.write(text)
            except BrokenPipeError:
                self._drop()
            self.flush()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._drop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)  # encoding, isatty, fileno, ... as the stream's

    def _drop(self) -> None:
        self.gone = True
        # the interpreter's own flush at exit must not fail on the closed pipe either
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
    stdout = sys.stdout
    sys.stdout = _OutputReaderGone(stdout)
    try:
        return _main(argv)
    finally:
        sys.stdout = stdout
        outputs.release_all()


def _main(argv: Sequence[str] | None) -> int:
    try:
        # A usage error is a ConfigError too (exit 1): exit 2 means the gate failed.
        return int(run(parse(argv)))
    except AuditError as error:
        print(error.render(), file=sys.stderr)
        return int(error.exit_code)
    except KeyboardInterrupt:
        print(
            "fence-audit: interrupted; next: run the same command again: the verdicts "
            "so far are kept, and it resumes from them",
            file=sys.stderr,
        )
        return 130
    except Exception:
        traceback.print_exc()
        print(
            "fence-audit: internal error (a bug in fence-audit; please report it with the "
            "traceback above)",
            file=sys.stderr,
        )
        return int(ExitCode.INTERNAL)

"""The commands that run no test, one handler each: ``report``, ``gate``, ``accept`` and
``merge`` read saved audit.json files, ``catalogue check`` applies the catalogue to the
audited source, ``cache`` shows and prunes the cache; with the gate's options and lines
that ``mutate`` shares with them. :mod:`audit.cli` dispatches to them."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from audit import pipeline
from audit.core import cache as caches
from audit.core import environment, outputs
from audit.core.errors import ConfigError, ExitCode
from audit.core.files import write_text
from audit.core.inputs import check_cache_dir, resolved
from audit.core.text import first_of
from audit.mutation import catalogue as catalogues
from audit.rendering.reports import Written
from audit.results import standing
from audit.results.gate import GateResult
from audit.results.report_model import AuditResults, load_results
from audit.setup import sources
from audit.setup.config import Config, GateThresholds, percentage
from audit.setup.model import percent_text
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


def report(config: Config, args: argparse.Namespace) -> ExitCode:
    """``report``: every report rendered again from a saved audit.json; nothing runs."""
    path = resolved(args.results or config.reports_dir / "audit.json", "--results")
    previous = compared(args.compare) if args.compare else None
    written = pipeline.report(config, path, previous).written
    print(f"fence-audit: report {written.index}; summary {written.summary}; {written.junit}")
    print_skipped(written)
    return ExitCode.OK


def gate(config: Config, args: argparse.Namespace) -> ExitCode:
    """``gate``: a saved audit.json against the thresholds, or with ``--standing`` against
    its release's recorded standing (the thresholds when the release has none yet)."""
    path = resolved(args.results or config.reports_dir / "audit.json", "--results")
    limits = thresholds(config, args)
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
    return print_gate(pipeline.gate(results, limits, config))


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
    limits = thresholds(config, args)
    previous = compared(args.compare) if args.compare else None
    path = pipeline.merge(config, tuple(args.shards), limits)
    print(f"fence-audit: merged {len(args.shards)} shards into {path}")
    reported = pipeline.report(config, path, previous)
    code = print_gate(pipeline.gate(reported.results, limits, config))
    print_report_and_gate(reported, code)
    return code


def catalogue(config: Config, args: argparse.Namespace) -> ExitCode:
    """``catalogue check``: apply every entry to the audited source: it must apply,
    compile and change the named function, or be carried (the release already has that
    code) or not yet (its ``since`` is later). No test runs, so this is quick enough for
    a pre-commit check; ``--release V`` checks vLLM V's sdist without installing it."""
    entries = pipeline.load_entries(config)
    version, read = _catalogue_source(config, args.vllm_src, args.release)
    path, source = read(config.target)
    print(
        f"fence-audit: catalogue {config.catalogue_dir}: {len(entries)} entries; "
        f"target {path} (vLLM {version})"
    )
    regions = resolve_regions(source, config.regions, filename=path, version=version)
    functions = {region.name: region.functions for region in regions}
    aliases = catalogues.function_aliases(config.regions)
    counts = {"ok": 0, "CARRIED": 0, "NOT YET": 0, "STALE": 0}
    width = max((len(e.id) for e in entries), default=0)
    for entry in entries:
        where, text = read(entry.module) if entry.module else (path, source)
        outcome = catalogues.apply_entry(entry, text, where, version=version, aliases=aliases)
        if isinstance(outcome, catalogues.Applied):  # its region's functions, or stale
            outcome = catalogues.outside_region(entry, outcome, functions[entry.region]) or outcome
        if isinstance(outcome, catalogues.Applied):
            state, why = "ok", f"{entry.region}, line {outcome.line}"
        elif isinstance(outcome, catalogues.Carried):
            state, why = "CARRIED", f"this release carries this bug: {outcome.reason}"
        elif isinstance(outcome, catalogues.NotYet):
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
        caches.mark(config.cache_dir)

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


def cache(config: Config, args: argparse.Namespace) -> ExitCode:
    """``fence-audit cache``: the cache's entries by kind; with ``--prune`` or
    ``--max-mb``, first remove those no run has used for that many days, then the
    least recently used until the cache holds at most that many megabytes."""
    check_cache_dir(config.cache_dir, config.cache_dir_from, claim=False)
    root, prune_days, max_mb = config.cache_dir, args.prune, args.max_mb
    if prune_days is not None or max_mb is not None:
        max_bytes = None if max_mb is None else max_mb * 1_000_000
        removed = caches.prune(root, prune_days, max_bytes=max_bytes)
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
            f"{caches.megabytes(removed)} MB" + (f" ({which})" if which else "")
        )
    held = caches.contents(root)
    print(
        f"fence-audit: cache {root}: {_entries(len(held.entries))}, "
        f"{caches.megabytes(held.entries)} MB"
    )
    if held.entries:
        print()
        print(caches.format_contents(held.entries))
    if held.foreign:
        names = first_of([str(p.relative_to(root)) for p in held.foreign], 3)
        print(
            f"fence-audit: {len(held.foreign)} paths in the cache are not fence-audit's, "
            f"left as they are: {names}"
        )
    return ExitCode.OK


def _entries(n: int) -> str:
    return f"{n} entry" if n == 1 else f"{n} entries"


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

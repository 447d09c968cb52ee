"""The ``fence-audit`` command: the command line parsed, each command dispatched through
one table to its handler, the only place that catches :class:`AuditError`. The commands
that start a run (fetch, regions, coverage, bench, mutate) are handled here, every input
checked before the run starts; those that run no test are in :mod:`audit.commands`."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from audit import commands, pipeline
from audit.arguments import build_parser
from audit.baseline.coverage_map import format_table
from audit.commands import compared, print_gate, print_report_and_gate, print_skipped, thresholds
from audit.core import hermetic, outputs
from audit.core.errors import AuditError, ConfigError, ExitCode
from audit.core.inputs import check_cache_dir
from audit.judging.jobs import ExecutorOptions
from audit.mutation import changes
from audit.mutation import scope as scopes
from audit.results import shards
from audit.results.report_model import AuditResults
from audit.results.scores import Tally, format_scores
from audit.setup.config import (
    Config,
    GateThresholds,
    SuitePath,
    config_from_arguments,
    parse_suite_path,
)
from audit.setup.model import Mutant, MutantResult, percent_text


def _fetch(config: Config, args: argparse.Namespace) -> ExitCode:
    """``fetch``: vLLM's tests for the installed version, into the cache."""
    check_inputs(config, args, None)
    prepared = prepare(config, args, writes_reports=False)
    print(f"fence-audit: vLLM's tests are in {prepared.source.root}")
    return ExitCode.OK


def _regions(config: Config, args: argparse.Namespace) -> ExitCode:
    """``regions``: the regions resolved against the audited source."""
    check_inputs(config, args, None)
    prepared = prepare(config, args, writes_reports=False)
    for region in prepared.regions:
        spans = ", ".join(f"{s.start}-{s.end}" for s in region.spans)
        print(f"{region.name:<16} {len(region.lines):>4} lines  {spans}")
    return ExitCode.OK


def _coverage(config: Config, args: argparse.Namespace) -> ExitCode:
    """``coverage``: the baseline under per-test coverage; the region table."""
    entries = check_inputs(config, args, None)
    prepared = prepare(config, args)
    stage = baseline(prepared, entries, reuse=False, workers=os.cpu_count() or 1)
    stage.close()
    reports = config.reports_dir
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


def _bench(config: Config, args: argparse.Namespace) -> ExitCode:
    """``bench``: the baseline, then this executor timed against mutmut, fresh processes
    and the floor."""
    entries = check_inputs(config, args, None)
    prepared = prepare(config, args)
    stage = baseline(prepared, entries, reuse=False, workers=args.jobs)
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
    reports = config.reports_dir
    bench.write_bench(result, reports / "bench.json")
    print()
    print(bench.format_bench(result))
    print(f"\nfence-audit: benchmark in {reports / 'bench.json'}")
    return ExitCode.OK


def _mutate(config: Config, args: argparse.Namespace) -> ExitCode:
    """``mutate``: the baseline, then judge, write the reports, run the gate (a shard
    leaves the gate to ``merge``)."""
    if args.no_catalogue:  # mutmut's mutants only
        config = dataclasses.replace(config, catalogue_dir=None)
    # Every input is checked before the run: a bad one must not cost a download or a baseline.
    gate = thresholds(config, args)
    entries = check_inputs(config, args, gate)
    costs = shard_costs(args)
    previous = compared(args.compare) if args.compare else None
    prepared = prepare(config, args)
    if prepared.changed is not None:
        print_changed(prepared.changed)
        if not prepared.changed.lines:
            return unchanged(prepared, args, entries, previous)
    stage = baseline(prepared, entries, reuse=not args.no_cache, prime=True, workers=args.jobs)
    options = ExecutorOptions(jobs=args.jobs, use_cache=not args.no_cache)
    looks = pipeline.Looks(random_alone=args.random_alone, deep=args.deep)
    stage_result = pipeline.mutate(
        stage, options, tuple(args.region), args.engine, args.shard, costs, looks
    )
    report_mutation(stage_result)
    reports = prepared.config.reports_dir
    reported = pipeline.report(prepared.config, reports / "audit.json", previous)
    if args.shard is not None:
        print_shard(reported)
        return ExitCode.OK
    code = print_gate(pipeline.gate(reported.results, gate, prepared.config))
    print_report_and_gate(reported, code)
    return code


# Each command's handler: the configuration and the command line in, the exit code out.
COMMANDS: dict[str, Callable[[Config, argparse.Namespace], ExitCode]] = {
    "coverage": _coverage,
    "mutate": _mutate,
    "merge": commands.merge,
    "report": commands.report,
    "gate": commands.gate,
    "accept": commands.accept,
    "catalogue": commands.catalogue,
    "bench": _bench,
    "regions": _regions,
    "fetch": _fetch,
    "cache": commands.cache,
}


def run(args: argparse.Namespace) -> ExitCode:
    """The command's handler, given the configuration the command line selects."""
    return COMMANDS[args.command](config_from_arguments(args), args)


def prepare(
    config: Config, args: argparse.Namespace, *, writes_reports: bool = True
) -> pipeline.Prepared:
    """The run's start, once its inputs are checked: vLLM's tests fetched, the target
    and the regions resolved (with ``--since``, the changed lines); ``fetch`` and
    ``regions`` write nothing to the reports."""
    prepared = pipeline.prepare(
        config,
        vllm_src=args.vllm_src,
        writes_reports=writes_reports,
        since=getattr(args, "since", None),
        scope=getattr(args, "scope", scopes.REGIONS),
    )
    print(f"fence-audit: vLLM {prepared.vllm.version}; tests from {prepared.source.origin}")
    print(f"fence-audit: target {prepared.target.module} ({prepared.target.path})")
    return prepared


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


def print_shard(reported: pipeline.ReportStage) -> None:
    """A shard's run ends without the gate: its score is of a part of the run."""
    shard = reported.results.shard
    assert shard is not None
    print_skipped(reported.written)
    print(
        f"fence-audit: report {reported.written.index}; {shard.described()}; gate not "
        "checked: `fence-audit merge` every shard's audit.json, then the gate runs on the run"
    )


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

"""The command line's grammar: every command and option of ``fence-audit``.

A mistake on the command line is a usage error, exit 1 (exit 2 means the gate
failed): the parser raises a :class:`ConfigError` in the audit's own format
instead of argparse's ``sys.exit(2)``. Counts are checked here (``-j 0`` is refused,
not read as 1); everything that needs the configuration is checked in ``audit/cli.py``
before anything runs.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from audit import __version__
from audit.core.errors import ConfigError
from audit.results.shards import Shard
from audit.setup.values import is_release


class Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are the audit's: one line, exit 1, what to do."""

    def error(self, message: str) -> NoReturn:
        what_to_do = f"`{self.prog} --help` lists the options"
        # argparse takes a value that starts with '-' (--shard -1/2) for an option
        if found := re.fullmatch(r"argument (\S+): expected one argument", message):
            option = found[1].split("/")[-1]
            what_to_do = (
                f"give {option} a value (one that starts with '-' as {option}=VALUE); " + what_to_do
            )
        raise ConfigError(message, details={"command": self.prog, "next": what_to_do})


# Above this a count, a number of days or of seconds means nothing here, and would
# overflow the float arithmetic of times (10**400 days).
LARGEST = 10**9


def whole_number(minimum: int, maximum: int = LARGEST) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum``, at most ``maximum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:,}, not {text}")
        return value

    return parse


JOBS = whole_number(1)  # -j 0 or -1 would otherwise be read as one worker


def shard(text: str) -> Shard:
    """An argparse type: ``K/N``, shard K of N."""
    try:
        return Shard.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def path(text: str) -> Path:
    """An argparse type: a path, not an empty one (an empty path is the current folder,
    which no option means: ``--cache-dir ''`` would make it the cache)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (leave the option out for its default)")
    return Path(text)


def release(text: str) -> str:
    """An argparse type: a vLLM release's version (:func:`values.is_release`)."""
    if not is_release(text):
        raise argparse.ArgumentTypeError(f"{text!r}: not a vLLM release")
    return text


DEFAULT_STANDINGS = Path("locks") / "standings"


def build_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument(
        "--config",
        type=path,
        help="pyproject.toml holding [tool.fence-audit] (default: ./pyproject.toml if present)",
    )
    common.add_argument("--reports", type=path, help="output folder (default: reports)")
    common.add_argument("--cache-dir", type=path, help="download cache (default: see README)")
    common.add_argument(
        "--vllm-src",
        type=path,
        metavar="PATH",
        help="a local vLLM checkout: its tests and its target module are audited",
    )

    parser = Parser(
        prog="fence-audit",
        description="Mutation-testing and coverage audit of vLLM's KV-offloading fence.",
    )
    parser.add_argument("--version", action="version", version=f"fence-audit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    cov = commands.add_parser(
        "coverage",
        parents=[common],
        help="run the fence suite under per-test coverage; print the region table",
    )
    cov.add_argument(
        "--suite",
        action="append",
        default=[],
        metavar="ROOT:PATH",
        help="a test path (vllm:PATH or project:PATH); repeat to select several; "
        "replaces the configured selection",
    )
    cov.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="ROOT:PATH",
        help="a pytest plugin file loaded into every test process; repeat for several; "
        "replaces the configured plugins",
    )
    mutate = commands.add_parser(
        "mutate",
        parents=[common],
        help="baseline, then judge every in-region mutant; write reports/audit.json",
    )
    mutate.add_argument(
        "-j", "--jobs", type=JOBS, default=os.cpu_count() or 1, help="workers (default: cores)"
    )
    mutate.add_argument(
        "--no-cache", action="store_true", help="judge every mutant again, ignoring the cache"
    )
    mutate.add_argument(
        "--suite", action="append", default=[], metavar="ROOT:PATH", help="as for coverage"
    )
    mutate.add_argument(
        "--plugin", action="append", default=[], metavar="ROOT:PATH", help="as for coverage"
    )
    mutate.add_argument(
        "--engine",
        choices=("fork", "mutmut"),
        default="fork",
        help="fork: the warm executor (default); mutmut: mutmut's own runner, to cross-check",
    )
    mutate.add_argument(
        "--region",
        action="append",
        default=[],
        metavar="NAME",
        help="judge only this region's mutants; repeat for several (default: all)",
    )
    add_gate_options(mutate)
    mutate.add_argument(
        "--compare", type=path, metavar="OLD_AUDIT_JSON", help="show changes since this run"
    )
    mutate.add_argument(
        "--no-catalogue",
        action="store_true",
        help="judge mutmut's mutants only, not the catalogue's (the benchmark compares "
        "with mutmut, which cannot apply them)",
    )
    mutate.add_argument(
        "--scope",
        choices=("regions", "file"),
        default="regions",
        help="regions: the mutants of the fence regions (default); file: every mutant of "
        "the audited module, those outside the regions grouped by function and scored apart",
    )
    mutate.add_argument(
        "--since",
        metavar="REF",
        help="pull-request mode, with --vllm-src: judge only the mutants on the target's "
        "lines changed since this git ref (a branch, tag or commit of the checkout)",
    )
    mutate.add_argument(
        "--random-alone",
        action="store_true",
        help="also judge every fence mutant by the suite's random workloads alone "
        "([tool.fence-audit.suite] random-workloads): the reports' \"random workloads "
        'alone" column',
    )
    mutate.add_argument(
        "--deep",
        action="store_true",
        help="judge every survivor again by the random workloads alone under a longer "
        "Hypothesis profile, time-boxed per mutant ([tool.fence-audit] deep); a kill "
        "there is shown with its example as a regression test",
    )
    mutate.add_argument(
        "--shard",
        type=shard,
        metavar="K/N",
        help="judge only shard K of the run's mutants dealt over N jobs (by predicted cost); "
        "the gate is left to `fence-audit merge`",
    )
    mutate.add_argument(
        "--shard-costs",
        type=path,
        metavar="COVERAGE_MAP",
        help="with --shard: deal by the test durations of this coverage-map.json (the same "
        "for every shard) rather than by this run's baseline",
    )
    merge = commands.add_parser(
        "merge",
        parents=[common],
        help="put the audit.json of every shard of a run together into one, then write the "
        "reports and check the gate, as mutate does",
    )
    merge.add_argument(
        "shards", nargs="+", type=path, metavar="SHARD_JSON", help="each shard's audit.json"
    )
    add_gate_options(merge)
    merge.add_argument(
        "--compare", type=path, metavar="OLD_AUDIT_JSON", help="show changes since this run"
    )
    report = commands.add_parser(
        "report",
        parents=[common],
        help="render every report (index.html, regions/, summary.md, junit.xml, mutation.json) "
        "from a saved audit.json",
    )
    report.add_argument("--results", type=path, help="default: REPORTS/audit.json")
    report.add_argument(
        "--compare", type=path, metavar="OLD_AUDIT_JSON", help="show changes since this run"
    )
    add_gate_commands(commands, common)
    catalogue_cmd = commands.add_parser(
        "catalogue",
        parents=[common],
        help="catalogue of hand-written mutants: `check` validates every entry, runs no test",
    )
    catalogue_cmd.add_argument("action", choices=("check",), help="check: apply, compile, compare")
    catalogue_cmd.add_argument(
        "--release",
        type=release,
        metavar="VERSION",
        help="check against vLLM VERSION's sdist (downloaded once, cached), not installed",
    )
    bench = commands.add_parser(
        "bench",
        parents=[common],
        help="time this executor against mutmut, fresh processes and the floor",
    )
    bench.add_argument("-j", "--jobs", type=JOBS, default=os.cpu_count() or 1)
    bench.add_argument("--region", action="append", default=[], metavar="NAME")
    bench.add_argument(
        "--scope", choices=("regions", "file"), default="regions", help="as for mutate"
    )
    bench.add_argument("--suite", action="append", default=[], metavar="ROOT:PATH")
    bench.add_argument(
        "--sample",
        type=whole_number(1),
        default=5,
        help="mutants judged in fresh processes (default 5)",
    )
    commands.add_parser(
        "regions", parents=[common], help="resolve the regions against the audited source"
    )
    commands.add_parser(
        "fetch",
        parents=[common],
        help="fetch vLLM's tests for the installed version into the cache",
    )
    add_cache_command(commands, common)
    return parser


def add_gate_commands(commands: argparse._SubParsersAction[Parser], common: Parser) -> None:
    """``gate`` (thresholds, or a release's standing) and ``accept`` (record a standing)."""
    gate = commands.add_parser(
        "gate",
        parents=[common],
        help="check a saved audit.json against the thresholds (exit 2 below, 3 timeouts only)",
    )
    gate.add_argument("--results", type=path, help="default: REPORTS/audit.json")
    gate.add_argument(
        "--standing",
        type=path,
        nargs="?",
        const=DEFAULT_STANDINGS,
        metavar="DIR",
        help="compare with the release's recorded standing in DIR (default "
        f"{DEFAULT_STANDINGS}) instead of the thresholds: exit 17 when worse; a release "
        "with no standing is gated by the thresholds",
    )
    add_gate_options(gate)
    accept = commands.add_parser(
        "accept",
        parents=[common],
        help="record the release's standing from a saved audit.json (reviewed in a pull "
        "request; the scheduled gate compares with it)",
    )
    accept.add_argument("--results", type=path, help="default: REPORTS/audit.json")
    accept.add_argument(
        "--standings",
        type=path,
        default=DEFAULT_STANDINGS,
        metavar="DIR",
        help=f"where standings are kept (default {DEFAULT_STANDINGS})",
    )
    accept.add_argument(
        "--reason",
        action="append",
        default=[],
        metavar="MUTANT_ID=WHY",
        help="why a mutant left alive is accepted (a reason already recorded is kept)",
    )


def add_cache_command(commands: argparse._SubParsersAction[Parser], common: Parser) -> None:
    """``fence-audit cache [--prune DAYS] [--max-mb MB]``."""
    cache_cmd = commands.add_parser(
        "cache", parents=[common], help="what the cache holds; remove what no run has used"
    )
    cache_cmd.add_argument(
        "--prune",
        type=whole_number(0),
        metavar="DAYS",
        help="remove the entries no run has used for DAYS days (0: every entry)",
    )
    cache_cmd.add_argument(
        "--max-mb",
        type=whole_number(0),
        metavar="MB",
        help="then remove the least recently used entries until the cache holds at most MB",
    )


def add_gate_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fail-under",
        type=float,
        metavar="PERCENT",
        help="minimum overall score (default: [tool.fence-audit.gate] fail-under)",
    )
    parser.add_argument(
        "--fail-under-region",
        action="append",
        default=[],
        metavar="NAME=PERCENT",
        help="minimum score of one region; repeat for several",
    )
    parser.add_argument(
        "--min-line-coverage",
        type=float,
        metavar="PERCENT",
        help="minimum line coverage of every region by the baseline",
    )

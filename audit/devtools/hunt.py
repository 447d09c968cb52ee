"""The hunt (``nox -s hunt``): the fence suite's random workloads on unmutated vLLM, time-boxed.

The runner is ``tests/fence/fence_hunt.py``: it drives the state machines the fence
suite registers for the hunt (``tests/fence/fence_machines.py``, ``MACHINES``) under the
``long`` profile, in rounds, until the time box is up or a machine raises. This module
is the part that needs neither vLLM, nor Hypothesis, nor the suite: the hunt's command
line, its result (which names the machines that ran, and their files), ``hunt.md`` and
the exit code.

A violation is *new* when the machine raises: the known vLLM bugs are tolerated by the
machine itself (``tolerate=``, ``docs/findings.toml``), so whatever it raises is either
a vLLM bug nobody has written up yet or a fault of the harness, for a person to triage.
"""

from __future__ import annotations

import argparse
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from audit.arguments import Parser, whole_number
from audit.core import outputs
from audit.core.errors import ConfigError, ExitCode
from audit.core.files import write_text
from audit.setup.config import Config, config_from_arguments

REPORT = "hunt.md"
DEFAULT_SECONDS = 600
SECONDS_ENV = "FENCE_AUDIT_HUNT_SECONDS"
# Programs per round: one Hypothesis run each. Small enough that the hunt overruns its
# time box by little (a round of 20 programs of 60 steps takes about 15 s on one core),
# large enough that Hypothesis' first, simplest program of each run is a small share.
ROUND_EXAMPLES = 20
PROFILE = "long"
# The hunt's process hashes strings and bytes by one seed, its own: vLLM iterates sets
# of request ids and of block hashes in hash order (up to 0.33.0 a store job's keys are
# a set, marked evictable in its order, and a full CPU tier evicts the first), so a
# program's outcome can follow the seed. By default it is
# the first round's seed (modulo the range PYTHONHASHSEED takes), so --seed replays a
# hunt in full; hunt.md names it, and --hash-seed replays a later round under it.
HASH_SEEDS = 2**32
# What the runner sets, beside PYTHONHASHSEED, when it starts itself again under the
# hunt's hash seed: the process was started with that seed, not just told of it.
HASH_SEED_ENV = "FENCE_AUDIT_HUNT_HASH_SEED"


@dataclass(frozen=True, slots=True)
class HuntOptions:
    config: Config
    seconds: int  # the time box: no round starts after it
    seed: int  # the first round's seed; round k (from 1) has seed + k - 1
    round_examples: int  # programs per round
    steps: int | None  # steps per program; None: the long profile's
    explain: bool = False  # Hypothesis' explain phase (the long profile has it)
    hash_seed: int = 0  # the string hash seed the hunt's process runs under


@dataclass(frozen=True, slots=True)
class Finding:
    """What the machine raised, as Hypothesis reported it after shrinking."""

    kind: str  # the exception's class: FenceViolation, ContentViolation, AssertionError...
    message: str  # the invariant that failed, as the oracle or the harness words it
    program: str  # Hypothesis' printed reproduction: the shrunk steps
    reproduce: str  # Hypothesis' ``@reproduce_failure(...)`` decorator, or ""
    where: str  # the innermost frames of the traceback
    round: int  # from 1
    seed: int  # that round's seed
    machine: str  # the state machine that raised: one of the result's machines


@dataclass(frozen=True, slots=True)
class HuntResult:
    vllm_version: str
    seconds: int  # the time box
    elapsed: float  # seconds the hunt ran, shrinking included
    seed: int  # the first round's seed
    round_examples: int
    steps: int  # steps per program
    rounds: int  # rounds started
    programs: int  # programs the machine ran (with a finding: shrinking included)
    # the state machines a round ran, in order, each (class, file from the project's
    # root): those the suite registers and this release runs
    machines: tuple[tuple[str, str], ...]
    finding: Finding | None = None
    interrupted: bool = False
    # the string hash seed the process ran under; None: not one the hunt chose (a
    # process it did not start hashes by a seed of its own, which no command replays)
    hash_seed: int | None = None
    # each known vLLM bug the machines tolerated (docs/findings.toml), by the label the
    # harness records it under, and how many programs met it
    tolerated: tuple[tuple[str, int], ...] = ()
    # what the hunt sets in the machines' modules before its rounds (Python statements):
    # a replay outside the hunt sets them too, or runs another program
    settings: tuple[str, ...] = ()

    def replay(self, seed: int) -> str:
        """The command that replays rounds from ``seed`` on, under this hunt's hashing."""
        hashed = "" if self.hash_seed is None else f" --hash-seed {self.hash_seed}"
        return (
            f"nox -s hunt -- --seed {seed}{hashed} --round-examples {self.round_examples} "
            f"--steps {self.steps}"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="nox -s hunt --",
        description="Random fence workloads (the long profile) on unmutated vLLM, time-boxed.",
    )
    parser.add_argument(
        "--seconds",
        type=whole_number(1),
        help=f"the time box (default: ${SECONDS_ENV}, else {DEFAULT_SECONDS}); "
        "no round starts after it",
    )
    parser.add_argument(
        "--seed",
        type=whole_number(0, 2**64),  # a seed is no quantity: a drawn one is below 2**32
        help="the first round's seed (default: random); round k has seed + k - 1, so the "
        "seed a finding names replays its round first",
    )
    parser.add_argument(
        "--hash-seed",
        type=whole_number(0, HASH_SEEDS - 1),
        help="the string hash seed the hunt runs under (PYTHONHASHSEED; default: the "
        "first round's seed modulo 2**32); hunt.md names it",
    )
    parser.add_argument(
        "--round-examples",
        type=whole_number(1),
        default=ROUND_EXAMPLES,
        help=f"programs per round, one Hypothesis run (default {ROUND_EXAMPLES})",
    )
    parser.add_argument(
        "--steps",
        type=whole_number(1),
        help="steps per program (default: the long profile's, 60)",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="run Hypothesis' explain phase too (off by default: it traces every program "
        "the shrinker tries, which made one real finding's shrinking take over 5 minutes)",
    )
    parser.add_argument("--reports", type=Path, help="output folder (default: reports)")
    parser.add_argument(
        "--config",
        type=Path,
        help="pyproject.toml holding [tool.fence-audit] (default: ./pyproject.toml if present)",
    )
    return parser


def hunt_options(argv: Sequence[str] | None, environ: Mapping[str, str]) -> HuntOptions:
    """The hunt's options from its command line, the environment and the configuration."""
    args = build_parser().parse_args(argv)
    config = config_from_arguments(args)
    seed = secrets.randbelow(2**32) if args.seed is None else args.seed
    return HuntOptions(
        config=config,
        seconds=args.seconds or seconds_from(environ),
        seed=seed,
        round_examples=args.round_examples,
        steps=args.steps,
        explain=args.explain,
        hash_seed=seed % HASH_SEEDS if args.hash_seed is None else args.hash_seed,
    )


def restart_command(
    argv: Sequence[str], options: HuntOptions, environ: Mapping[str, str]
) -> tuple[list[str], dict[str, str]] | None:
    """The runner's arguments and environment to start itself again under the hunt's
    hash seed, its seed drawn once and kept; None when this process already runs
    under it."""
    if started_hash_seed(options, environ) is not None:
        return None
    seeds = ["--seed", str(options.seed), "--hash-seed", str(options.hash_seed)]
    hashed = str(options.hash_seed)
    return [*argv, *seeds], {**environ, "PYTHONHASHSEED": hashed, HASH_SEED_ENV: hashed}


def started_hash_seed(options: HuntOptions, environ: Mapping[str, str]) -> int | None:
    """The hunt's hash seed if the runner started this process under it, else None
    (a process it did not start, such as a test's, hashes by its own seed)."""
    hashed = str(options.hash_seed)
    if environ.get("PYTHONHASHSEED") == hashed and environ.get(HASH_SEED_ENV) == hashed:
        return options.hash_seed
    return None


def seconds_from(environ: Mapping[str, str]) -> int:
    """The time box ``$FENCE_AUDIT_HUNT_SECONDS`` sets, else the default."""
    text = environ.get(SECONDS_ENV, "").strip()
    if not text:
        return DEFAULT_SECONDS
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(
            f"{SECONDS_ENV}={text!r} is not a whole number of seconds of at least 1",
            details={"next": f"set it to a time box in seconds (default {DEFAULT_SECONDS})"},
        )
    return int(text)


_REPRODUCE = re.compile(r"@reproduce_failure\([^)]*\)")


def parse_notes(notes: Sequence[str]) -> tuple[str, str]:
    """The shrunk program and the ``@reproduce_failure`` decorator from the notes
    Hypothesis attaches to the exception of a failing state machine."""
    lines = [line for note in notes for line in str(note).splitlines()]
    program: list[str] = []
    for line in lines:
        if line.startswith("state = ") or program:
            program.append(line)
        if line == "state.teardown()" and program:
            break
    found = next((m[0] for line in lines if (m := _REPRODUCE.search(line))), "")
    return "\n".join(program), found


def exit_code(result: HuntResult) -> ExitCode:
    if result.finding is not None:
        return ExitCode.HUNT_FOUND
    if result.interrupted:
        return ExitCode.INTERRUPTED
    return ExitCode.OK


def write_report(root: Path, result: HuntResult) -> Path:
    """Write ``root/hunt.md``, listed as fence-audit's before it is written."""
    outputs.claim(root, REPORT)
    path = root / REPORT
    write_text(path, render(result))
    return path


def summary_line(result: HuntResult, path: Path) -> str:
    ran = f"{_count(result.programs, 'program')} in {_count(result.rounds, 'round')}, "
    ran += f"{result.elapsed:.0f} s"
    if result.finding is not None:
        first = result.finding.message.strip().splitlines()[0] if result.finding.message else ""
        return (
            f"hunt: FOUND {result.finding.kind} ({first}) in round {result.finding.round}, "
            f"seed {result.finding.seed} ({ran}); the shrunk program is in {path} "
            f"(exit {int(ExitCode.HUNT_FOUND)})"
        )
    if result.interrupted:
        return f"hunt: interrupted, no violation in {ran}: {path}"
    return f"hunt: no violation in {ran} on vLLM {result.vllm_version}: {path}"


def render(result: HuntResult) -> str:
    """``hunt.md``: what ran, and the finding with its shrunk program for triage."""
    finding = result.finding
    if finding is not None:
        title = f"a violation found on vLLM {result.vllm_version}"
    elif result.interrupted:
        title = f"interrupted, no violation so far on vLLM {result.vllm_version}"
    else:
        title = f"no violation in {result.seconds} s on vLLM {result.vllm_version}"
    last = result.seed + max(result.rounds - 1, 0)
    lines = [
        f"# Fence hunt: {title}",
        "",
        f"- vLLM: {_text(result.vllm_version)}",
        f"- profile: `{PROFILE}`, {result.steps} steps per program, in rounds of "
        f"{result.round_examples} programs of each machine ("
        + ", ".join(f"`{name}` of `{path}`" for name, path in result.machines)
        + "); one Hypothesis run per machine and round, no example database",
        f"- time box: {result.seconds} s; ran {result.elapsed:.0f} s"
        + (" (shrinking included)" if finding else ""),
        f"- programs run: {result.programs} in {_count(result.rounds, 'round')}"
        + (" (shrinking included)" if finding else ""),
        f"- seeds: {result.seed}"
        + (f" to {last}" if last != result.seed else "")
        + f" (round k: {result.seed} + k - 1); `{result.replay(result.seed)}` replays these "
        "rounds in order",
        _hash_line(result),
        _tolerated_line(result),
        "",
    ]
    if finding is None:
        held = (
            "Every program kept every fence invariant (I1-I10), no block was overwritten "
            "while a store read it, the fence drained after every program, and every "
            "chunk a liveness check (L1-L4) held a program to was offered to the tier."
        )
        lines += [
            f"No violation: the machines raised nothing in {result.programs} programs"
            + (" before the hunt was interrupted." if result.interrupted else "."),
            held,
            "",
        ]
        return "\n".join(lines)
    replay = f"`{result.replay(finding.seed)}`"
    lines += [
        "## The violation",
        "",
        f"Round {finding.round}, seed {finding.seed} ({replay} replays it first). "
        f"`{finding.machine}` raised `{finding.kind}`:",
        "",
        *_fenced(finding.message, "text"),
        "",
        "## The shrunk program",
        "",
        "Hypothesis' reproduction of the state machine's steps "
        f"(`{finding.machine}` of `{dict(result.machines)[finding.machine]}`):",
        "",
        *_fenced(finding.program or "(Hypothesis printed no program)", "python"),
        "",
    ]
    if result.settings:
        lines += [
            "The hunt ran it with these settings of the machines' modules; a replay "
            "outside the hunt needs them first, or it runs another program:",
            "",
            *_fenced("\n".join(result.settings), "python"),
            "",
        ]
    if finding.reproduce:
        lines += [
            f"`{finding.reproduce}` on `{finding.machine}` replays this program alone "
            "(the same Hypothesis version).",
            "",
        ]
    if finding.where:
        lines += ["## Where it was raised", "", *_fenced(finding.where, "text"), ""]
    lines += [
        "## Triage",
        "",
        "The machine tolerates the known vLLM bugs (`docs/findings.toml`), so this is new: "
        "either a vLLM bug (write it up in `docs/`, register it in `docs/findings.toml`, "
        "keep its program as a strict expected failure in `tests/fence/test_vllm_bugs.py`) "
        "or a fault of the harness (`tests/fence/`: fix it, keep the program as a test).",
        "",
    ]
    return "\n".join(lines)


def _hash_line(result: HuntResult) -> str:
    if result.hash_seed is None:
        return (
            "- string hash seed: the process's own (not started by the hunt's runner), so "
            "the order of vLLM's sets of request ids and block hashes may not replay"
        )
    return (
        f"- string hash seed: {result.hash_seed} (`PYTHONHASHSEED`): the order vLLM "
        "iterates its sets of request ids and block hashes in, which a program's outcome "
        "can follow"
    )


def _tolerated_line(result: HuntResult) -> str:
    if not result.tolerated:
        return "- known vLLM bugs tolerated: none met"
    met = "; ".join(f"{_text(label)} ({_count(n, 'program')})" for label, n in result.tolerated)
    return f"- known vLLM bugs tolerated (met, recorded, not reported): {met}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _fenced(text: str, language: str) -> list[str]:
    """``text`` in a code fence longer than any run of backticks in it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + language, text.rstrip("\n"), fence]


def _text(value: str) -> str:
    """Run-derived text outside a code span, escaped as summary.md escapes it."""
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")

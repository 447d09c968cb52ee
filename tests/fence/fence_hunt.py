"""The hunt: the fence suite's random workloads on unmutated vLLM, time-boxed.

``nox -s hunt`` runs this file with the lean environment's python:

    python tests/fence/fence_hunt.py [--seconds N] [--seed S] [--reports DIR] ...

It writes ``REPORTS/hunt.md`` (``audit/devtools/hunt.py`` renders it) and exits 0 when the
machine raised nothing in the time box, 14 when it raised (a new vLLM bug or a harness
fault: hunt.md holds the shrunk program), 1 on a usage error, 7 when the installed
vLLM is not the configured version, 130 when interrupted.

The time box. Hypothesis has no wall-clock limit, so the hunt runs the machine in
rounds: each round is one whole Hypothesis run per machine the suite registers for the
hunt (``fence_machines.MACHINES``, in order; hunt.md names each with its file) of
``round_examples`` programs under the ``long`` profile's settings (60 steps each, no
deadline) with its own seed, the first round's seed plus the round's index; a round
starts only while the time box has time left, so the hunt overruns it by at most one
round. A round is never cut short (a flag checked inside the machine would have to fail
or reject programs, which Hypothesis would shrink or count against the run), so each
round is exactly the run ``@seed(S)`` replays, and ``--seed S`` replays the hunt's
rounds in order. A round that fails is shrunk to the end (Hypothesis bounds shrinking
itself, at five minutes) and ends the hunt: its shrunk program is the finding.

The string hash seed. vLLM iterates sets of request ids and block hashes in hash order,
and a program's outcome can follow it (the 0.30.0 program of
docs/vllm-bug-stranded-finished-load.md stranded a load under three seeds of six). So
the runner starts itself again under the hunt's hash seed (``--hash-seed``, by default
the first round's seed) before it imports vLLM, and hunt.md names it: a finding's
command replays its round under the hashing it met.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

if __name__ == "__main__":  # run as a script: this folder and the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

from audit.core import environment, outputs
from audit.core.errors import AuditError
from audit.devtools.hunt import (
    Finding,
    HuntOptions,
    HuntResult,
    exit_code,
    hunt_options,
    parse_notes,
    restart_command,
    started_hash_seed,
    summary_line,
    write_report,
)
from audit.setup.config import Config

FRAMES = 8  # innermost frames of a finding's traceback shown in hunt.md
ROOT = Path(__file__).resolve().parents[2]


def main(argv: Sequence[str] | None = None, *, restart: bool = False) -> int:
    """``restart``: run as a script, start this file again under the hunt's string
    hash seed unless already under it (a test calling this in its own process does not:
    its result then names no hash seed)."""
    try:
        options = hunt_options(argv, os.environ)
        outputs.check_reports_dir(options.config.reports_dir)
        installed = environment.installed_vllm(options.config.vllm_version)
        args = list(sys.argv[1:] if argv is None else argv)
        if restart and (command := restart_command(args, options, os.environ)):
            again, environ = command
            sys.stdout.flush()
            sys.stderr.flush()
            runner = str(Path(__file__).resolve())
            os.execve(sys.executable, [sys.executable, runner, *again], environ)
        hashed = started_hash_seed(options, os.environ)  # before _hermetic sets the children's
        _hermetic(options.config)
        result = hunt(options, installed.version, hash_seed=hashed)
        path = write_report(options.config.reports_dir, result)
    except AuditError as error:
        print(error.render(), file=sys.stderr)
        return int(error.exit_code)
    print(summary_line(result, path), flush=True)
    return int(exit_code(result))


def hunt(
    options: HuntOptions,
    vllm_version: str,
    *,
    log: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    hash_seed: int | None = None,
) -> HuntResult:
    """Rounds of the state machine until the time box is up or the machine raises."""
    # vLLM is imported here, after _hermetic: the offline HF home comes first.
    from fence_machines import MACHINES, hunt_settings
    from hypothesis import Phase, seed, settings
    from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

    settings_made = hunt_settings()  # before any machine runs

    base = settings.get_profile("long")
    budget = settings(
        base,
        max_examples=options.round_examples,
        stateful_step_count=options.steps or base.stateful_step_count,
        database=None,  # each round is its seed's run alone, never a replay of another
        print_blob=True,
        report_multiple_bugs=False,
        phases=[p for p in base.phases if options.explain or p != Phase.explain],
    )
    programs = 0
    tolerated: Counter[str] = Counter()  # known vLLM bug -> programs that met it

    def counted(machine: type[RuleBasedStateMachine]) -> type[RuleBasedStateMachine]:
        class Counted(machine):  # type: ignore[misc,valid-type]
            def teardown(self) -> None:
                nonlocal programs
                # a FenceMachine program Hypothesis rejected built no engine
                engine = getattr(self, "engine", True)
                programs += engine is not None
                try:
                    super().teardown()
                finally:  # the drain's end can be a hit too
                    hits = getattr(engine, "known_bug_hits", ())
                    tolerated.update({label for label, _ in hits})

        return Counted

    machines = [(name, counted(machine)) for name, machine in MACHINES.items()]

    started = clock()
    rounds = 0
    finding: Finding | None = None
    interrupted = False
    while finding is None and (rounds == 0 or clock() - started < options.seconds):
        rounds += 1
        round_seed = options.seed + rounds - 1
        for name, base_machine in machines:
            # A class per round, named as Hypothesis prints it: `state = FenceMachine()`.
            machine = seed(round_seed)(type(name, (base_machine,), {}))
            try:
                run_state_machine_as_test(machine, settings=budget)
            except KeyboardInterrupt:
                interrupted = True
                break
            except Exception as error:  # whatever a machine raises is the finding
                finding = _finding(error, rounds, round_seed, name)
                break
        if interrupted:
            break
        log(
            f"hunt: round {rounds} (seed {round_seed}): "
            + ("RAISED" if finding else "nothing raised")
            + f"; {programs} programs, {clock() - started:.0f} of {options.seconds} s"
        )
    return HuntResult(
        vllm_version=vllm_version,
        seconds=options.seconds,
        elapsed=clock() - started,
        seed=options.seed,
        round_examples=options.round_examples,
        steps=budget.stateful_step_count,
        rounds=rounds,
        programs=programs,
        finding=finding,
        interrupted=interrupted,
        machines=tuple((name, _source(MACHINES[name])) for name, _ in machines),
        hash_seed=hash_seed,
        tolerated=tuple(sorted(tolerated.items())),
        settings=settings_made,
    )


def _source(machine: type) -> str:
    """The file that defines ``machine``, from the project's root."""
    return Path(inspect.getfile(machine)).resolve().relative_to(ROOT).as_posix()


def _finding(error: BaseException, round_index: int, round_seed: int, machine: str) -> Finding:
    program, reproduce = parse_notes(getattr(error, "__notes__", ()))
    # The harness's frames and vLLM's: Hypothesis' and this runner's say nothing of the bug.
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if "/hypothesis/" not in frame.filename and frame.filename != __file__
    ][-FRAMES:]
    return Finding(
        kind=type(error).__name__,
        message=str(error),
        program=program,
        reproduce=reproduce,
        where="".join(traceback.format_list(frames)).rstrip(),
        round=round_index,
        seed=round_seed,
        machine=machine,
    )


def _hermetic(config: Config) -> None:
    """What the audit's test process gets (audit/core/hermetic.py), before vLLM is imported:
    an offline, private Hugging Face home, the CPU platform, no network. A pytest that
    runs the fence suite has it already (tests/fence/conftest.py). Either way, the
    platform stand-in (audit/testproc/stand_in.py: vLLM 0.34.0's Triton check) and the
    offline hub's answer (audit/testproc/offline_hub.py)."""
    from audit.testproc import offline_hub, stand_in

    stand_in.install()
    offline_hub.install()
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return
    from audit.core.hermetic import child_environment, prepare_hf_home
    from audit.testproc.isolation import block_network

    hf_home = prepare_hf_home(config.cache_dir, config.offline_models)
    os.environ.update(child_environment(os.environ, hf_home))
    # The rounds' lines, not vLLM's warnings (thousands of "cannot store chunks" a round).
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"])
    block_network()


if __name__ == "__main__":
    sys.exit(main(restart=True))

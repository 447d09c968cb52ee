"""The hunt's vLLM-free part (audit/devtools/hunt.py): options, Hypothesis' notes,
hunt.md, exit codes.
The hunt itself, on the real scheduler, is tests/hunt/test_hunt_vllm.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from audit.core import outputs
from audit.core.errors import ConfigError, ExitCode
from audit.devtools.hunt import (
    DEFAULT_SECONDS,
    HASH_SEED_ENV,
    HASH_SEEDS,
    SECONDS_ENV,
    Finding,
    HuntResult,
    exit_code,
    hunt_options,
    parse_notes,
    render,
    restart_command,
    seconds_from,
    started_hash_seed,
    write_report,
)

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

NOTES = [
    "Failing test case: <state machine>",
    "state = FenceMachine()",
    "state.start(layout='full', seed=0)",
    "state.step(steps=1)",
    "state.teardown()",
    "Explanation:",
    "    These lines were always and only run by failing test cases:",
    "\nYou can reproduce this test case by temporarily adding "
    "@reproduce_failure('6.170.17', b'AXicY3Bk+/A=') as a decorator on your test function",
]


# The machines a hunt on a release that runs all five names, as the runner gives them.
MACHINES = (
    ("FenceMachine", "tests/fence/fence_machines.py"),
    ("RemoteWindowMachine", "tests/fence/fence_machines.py"),
    ("WindowMachine", "tests/fence/fence_machines.py"),
    ("RecurrentMachine", "tests/fence/fence_recurrent.py"),
    ("SpeculativeMachine", "tests/fence/fence_machines.py"),
)


def _result(finding: Finding | None = None, **changes: object) -> HuntResult:
    fields: dict[str, object] = {
        "vllm_version": "0.33.0",
        "seconds": 600,
        "elapsed": 612.4,
        "seed": 40,
        "round_examples": 20,
        "steps": 60,
        "rounds": 31,
        "programs": 620,
        "machines": MACHINES,
        "finding": finding,
    }
    fields.update(changes)
    return HuntResult(**fields)  # type: ignore[arg-type]


def _finding(message: str = "fence invariants broken:\n  I7 registered iff finished") -> Finding:
    program, reproduce = parse_notes(NOTES)
    return Finding(
        "FenceViolation",
        message,
        program,
        reproduce,
        "  File x",
        round=3,
        seed=42,
        machine="FenceMachine",
    )


def test_the_notes_give_the_shrunk_program_and_the_reproduce_decorator() -> None:
    program, reproduce = parse_notes(NOTES)
    assert program.splitlines() == NOTES[1:5]
    assert reproduce == "@reproduce_failure('6.170.17', b'AXicY3Bk+/A=')"
    assert parse_notes(["something else"]) == ("", "")


def test_the_time_box_comes_from_the_option_then_the_environment_then_the_default() -> None:
    config = ["--config", str(PYPROJECT)]
    assert hunt_options(config, {}).seconds == DEFAULT_SECONDS == 600
    assert hunt_options(config, {SECONDS_ENV: "90"}).seconds == 90
    assert hunt_options([*config, "--seconds", "5"], {SECONDS_ENV: "90"}).seconds == 5
    for bad in ("0", "ten", "-3"):
        with pytest.raises(ConfigError, match=SECONDS_ENV):
            seconds_from({SECONDS_ENV: bad})
    with pytest.raises(ConfigError) as usage:
        hunt_options([*config, "--seconds", "0"], {})
    assert usage.value.exit_code == ExitCode.USAGE


def test_a_seed_of_any_round_a_hunt_drew_replays() -> None:
    config = ["--config", str(PYPROJECT)]
    drawn = {hunt_options(config, {}).seed for _ in range(20)}
    assert all(0 <= s < 2**32 for s in drawn)
    late = 2**32 - 1 + 500  # round 501 of a hunt that drew the largest seed
    assert hunt_options([*config, "--seed", str(late)], {}).seed == late
    with pytest.raises(ConfigError, match="--seed: must be at least 0"):
        hunt_options([*config, "--seed", "-1"], {})


def test_the_hash_seed_is_the_first_round_s_seed_unless_given() -> None:
    config = ["--config", str(PYPROJECT)]
    assert hunt_options([*config, "--seed", "40"], {}).hash_seed == 40
    late = HASH_SEEDS + 9  # a seed past PYTHONHASHSEED's range wraps into it
    assert hunt_options([*config, "--seed", str(late)], {}).hash_seed == 9
    given = hunt_options([*config, "--seed", "40", "--hash-seed", "3"], {})
    assert (given.seed, given.hash_seed) == (40, 3)
    drawn = hunt_options(config, {})
    assert drawn.hash_seed == drawn.seed % HASH_SEEDS
    for bad, says in (("-1", "at least 0"), (str(HASH_SEEDS), "at most 4,294,967,295")):
        with pytest.raises(ConfigError, match=f"--hash-seed: must be {says}"):
            hunt_options([*config, "--hash-seed", bad], {})


def test_the_runner_starts_again_under_the_hash_seed_until_it_runs_under_it() -> None:
    argv = ["--config", str(PYPROJECT), "--seconds", "5"]
    options = hunt_options(argv, {})  # a drawn seed
    command = restart_command(argv, options, {"HOME": "/home/x", "PYTHONHASHSEED": "random"})
    assert command is not None
    args, environ = command
    again = hunt_options(args, environ)
    assert (again.seed, again.hash_seed, again.seconds) == (options.seed, options.hash_seed, 5)
    assert environ["HOME"] == "/home/x"
    assert environ["PYTHONHASHSEED"] == environ[HASH_SEED_ENV] == str(options.hash_seed)
    assert started_hash_seed(again, environ) == options.hash_seed
    assert restart_command(args, again, environ) is None  # no second start
    # PYTHONHASHSEED alone (a test's process, a pytest conftest's children's setting)
    # is no proof that this process started under it
    alone = {"PYTHONHASHSEED": str(options.hash_seed)}
    assert started_hash_seed(options, alone) is None
    assert restart_command(argv, options, alone) is not None


def test_hunt_md_names_the_hash_seed_and_replays_under_it() -> None:
    text = render(_result(_finding(), hash_seed=42))
    assert "- string hash seed: 42 (`PYTHONHASHSEED`)" in text
    assert "`nox -s hunt -- --seed 40 --hash-seed 42 --round-examples 20 --steps 60`" in text
    assert "(`nox -s hunt -- --seed 42 --hash-seed 42 --round-examples 20 --steps 60`" in text
    unknown = render(_result(_finding()))
    assert "- string hash seed: the process's own" in unknown
    assert "--hash-seed" not in unknown


def test_hunt_md_gives_the_settings_a_replay_needs() -> None:
    setting = "fence_machines.REMOTE_WINDOW_RETENTION = [0, None]"
    text = render(_result(_finding(), settings=(setting,)))
    assert "a replay outside the hunt needs them first" in text
    assert f"```python\n{setting}\n```" in text
    assert "a replay outside the hunt" not in render(_result(_finding()))


def test_hunt_md_counts_the_programs_that_met_each_tolerated_bug() -> None:
    met = (("a finished load stranded", 3), ("store of a request finished after", 1))
    text = render(_result(tolerated=met))
    assert (
        "- known vLLM bugs tolerated (met, recorded, not reported): a finished load "
        "stranded (3 programs); store of a request finished after (1 program)"
    ) in text
    assert "- known vLLM bugs tolerated: none met" in render(_result())


def test_a_finding_is_exit_14_and_hunt_md_holds_its_program_and_invariant() -> None:
    result = _result(_finding())
    assert exit_code(result) == ExitCode.HUNT_FOUND
    text = render(result)
    assert text.startswith("# Fence hunt: a violation found on vLLM 0.33.0\n")
    assert "Round 3, seed 42 (`nox -s hunt -- --seed 42 --round-examples 20 --steps 60`" in text
    assert "```text\nfence invariants broken:\n  I7 registered iff finished\n```" in text
    assert "```python\nstate = FenceMachine()\n" in text
    assert "state.teardown()\n```" in text
    assert "`@reproduce_failure('6.170.17', b'AXicY3Bk+/A=')` on `FenceMachine`" in text
    assert "steps (`FenceMachine` of `tests/fence/fence_machines.py`):" in text


def test_nothing_found_is_exit_0_and_says_how_much_ran() -> None:
    result = _result()
    assert exit_code(result) == ExitCode.OK
    text = render(result)
    assert text.startswith("# Fence hunt: no violation in 600 s on vLLM 0.33.0\n")
    assert "- programs run: 620 in 31 rounds" in text
    assert "- seeds: 40 to 70 " in text
    assert "No violation: the machines raised nothing in 620 programs." in text
    assert exit_code(_result(interrupted=True)) == ExitCode.INTERRUPTED


def test_the_report_names_only_the_machines_that_ran_with_their_files() -> None:
    every = render(_result())
    assert "`RemoteWindowMachine` of `tests/fence/fence_machines.py`" in every
    fewer = render(_result(machines=(MACHINES[0], MACHINES[3])))
    assert (
        "of each machine (`FenceMachine` of `tests/fence/fence_machines.py`, "
        "`RecurrentMachine` of `tests/fence/fence_recurrent.py`);"
    ) in fewer
    assert "RemoteWindowMachine" not in fewer


def test_a_finding_names_the_file_of_the_machine_that_raised() -> None:
    finding = dataclasses.replace(_finding(), machine="RecurrentMachine")
    text = render(_result(finding))
    assert "`RecurrentMachine` raised `FenceViolation`" in text
    assert "steps (`RecurrentMachine` of `tests/fence/fence_recurrent.py`):" in text


def test_a_message_holding_backticks_cannot_close_its_fence() -> None:
    text = render(_result(_finding("a ``` inside, and ````` too")))
    assert "``````text\na ``` inside, and ````` too\n``````" in text


def test_hunt_md_is_listed_as_fence_audits_and_a_foreign_one_is_refused(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    path = write_report(reports, _result())
    assert path == reports / "hunt.md"
    manifest = json.loads((reports / outputs.MANIFEST).read_text())
    assert manifest["written"] == ["hunt.md"]
    outputs.check_reports_dir(reports)  # its own: a second hunt may replace it

    theirs = tmp_path / "theirs"
    (theirs / "logs").mkdir(parents=True)
    outputs.claim(theirs, "logs/baseline.log")
    (theirs / "hunt.md").write_text("someone's notes\n")
    with pytest.raises(ConfigError, match="did not write") as info:
        outputs.check_reports_dir(theirs)
    assert info.value.details["files"] == "hunt.md"

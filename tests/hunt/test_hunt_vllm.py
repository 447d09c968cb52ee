"""The hunt (``nox -s hunt``, ``fence_hunt.py``): hunt.md and the exit code, end to end on
the real scheduler, with short programs and a short time box so that each test takes
seconds."""

from __future__ import annotations

import re
from pathlib import Path

import fence_hunt
import pytest
from fence_machines import MACHINES
from fence_plant import plant
from test_fence_recurrent import plant_uncollected_copies
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)

from audit.core.errors import ExitCode

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _hunt(reports: Path, options: str) -> int:
    argv = ["--config", str(PYPROJECT), "--reports", str(reports), *options.split()]
    return fence_hunt.main(argv)


def test_a_hunt_that_meets_a_planted_bug_writes_its_shrunk_program(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """request_finished forgets to fence a finished request's in-flight stores (M-A3):
    a round of the hunt meets it, shrinks it, and hunt.md holds the program."""
    plant(
        monkeypatch,
        OffloadingConnectorScheduler,
        "request_finished",
        "self._block_id_to_pending_jobs.setdefault(bid, set()).add(job_id)",
        "pass",
    )
    reports = tmp_path / "reports"
    # Short programs: shrinking takes seconds.
    code = _hunt(reports, "--seconds 60 --seed 1 --round-examples 5 --steps 8")
    assert code == ExitCode.HUNT_FOUND
    text = (reports / "hunt.md").read_text()
    assert text.startswith("# Fence hunt: a violation found on vLLM ")
    # round k runs seed 1 + k - 1 (which round meets it depends on the machine's draws)
    found = re.search(r"Round (\d+), seed (\d+) ", text)
    assert found is not None
    assert int(found[2]) == 1 + int(found[1]) - 1
    assert "I7 registered iff finished" in text or "overwritten" in text
    program = text.split("## The shrunk program", 1)[1].split("```python\n", 1)[1]
    program = program.split("\n```", 1)[0].splitlines()
    # the first machine of a round that meets it (the engine machines can)
    machine = re.search(r"`(\w+)` raised `", text)
    assert machine is not None
    assert machine[1] in ("FenceMachine", "RemoteWindowMachine", "SpeculativeMachine")
    assert program[0] == f"state = {machine[1]}()"
    assert any(line.startswith("state.start(") for line in program)
    assert any(line.startswith("state.add_request(") for line in program)
    assert program[-1] == "state.teardown()"
    assert "@reproduce_failure(" in text
    assert "hunt: FOUND " in capsys.readouterr().out


def test_a_hunt_on_unmutated_vllm_says_nothing_was_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "reports"
    code = _hunt(reports, "--seconds 1 --seed 7 --round-examples 2 --steps 8")
    assert code == ExitCode.OK
    text = (reports / "hunt.md").read_text()
    assert text.startswith("# Fence hunt: no violation in 1 s on vLLM ")
    assert "No violation: the machines raised nothing in " in text
    assert "- seeds: 7" in text
    assert "## The shrunk program" not in text
    # every machine the suite registers ran, named with the file that defines it
    ran = ", ".join(
        f"`{name}` of `tests/fence/{machine.__module__}.py`" for name, machine in MACHINES.items()
    )
    assert f"of each machine ({ran});" in text
    out = capsys.readouterr().out
    assert "hunt: round 1 (seed 7): nothing raised" in out
    assert "hunt: no violation in " in out


@pytest.mark.skipif(
    not hasattr(OffloadingConnectorScheduler, "_build_aligned_boundary_store_jobs"),
    reason="this vLLM does not collect block copies (vLLM 0.29.0 on)",
)
def test_a_round_runs_the_recurrent_machine_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A bug only a Mamba layout reaches (block copies left out of the step's
    allocations): the engine machine cannot meet it, the recurrent one does, and
    hunt.md names that machine and its file."""
    plant_uncollected_copies(monkeypatch)
    reports = tmp_path / "reports"
    code = _hunt(reports, "--seconds 60 --seed 1 --round-examples 20 --steps 12")
    assert code == ExitCode.HUNT_FOUND
    text = (reports / "hunt.md").read_text()
    assert "`RecurrentMachine` raised `FenceViolation`" in text
    assert "(`RecurrentMachine` of `tests/fence/fence_recurrent.py`)" in text
    program = text.split("```python\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert program[0] == "state = RecurrentMachine()"
    assert "flush on reuse" in text


class _Started(Exception):
    pass


def test_the_runner_starts_itself_again_under_the_hunt_s_hash_seed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Run as a script, the runner replaces its process with itself under the hunt's
    hash seed before vLLM's workloads start; the new process runs the hunt."""
    started: list[tuple[str, list[str], dict[str, str]]] = []

    def execve(path: str, args: list[str], environ: dict[str, str]) -> None:
        started.append((path, args, environ))
        raise _Started

    monkeypatch.setattr(fence_hunt.os, "execve", execve)
    monkeypatch.delenv("FENCE_AUDIT_HUNT_HASH_SEED", raising=False)
    argv = ["--config", str(PYPROJECT), "--reports", str(tmp_path), "--seconds", "5"]
    with pytest.raises(_Started):
        fence_hunt.main([*argv, "--seed", "77"], restart=True)
    ((path, args, environ),) = started
    assert path == args[0]  # this python, as the nox session started it
    assert args[1] == fence_hunt.__file__
    assert args[2:] == [*argv, "--seed", "77", "--seed", "77", "--hash-seed", "77"]
    assert environ["PYTHONHASHSEED"] == environ["FENCE_AUDIT_HUNT_HASH_SEED"] == "77"
    assert not (tmp_path / "hunt.md").exists()  # the new process writes it

"""Ctrl-C and SIGKILL at several points of a real ``mutate`` run, each followed by a
resume: the resumed statuses equal a clean run's, the installed vLLM file is untouched,
and an interrupted judging never poisons the cache (issue 13)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fence_helpers import VLLM_VERSION, fence_audit, private_cache

from audit.core import environment

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
TARGET = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"
REGION = "removal"
SUITE = "vllm:tests/v1/kv_connector/unit/offloading_connector/test_scheduler.py"


def installed_sha() -> str:
    path = environment.installed_file(environment.installed_vllm(VLLM_VERSION), TARGET)
    return environment.sha256_file(path)


def command(folder: Path) -> list[str]:
    return [
        "mutate",
        *("--region", REGION, "--suite", SUITE),
        *("--config", str(folder / "pyproject.toml")),
        *("--cache-dir", str(folder / "cache"), "--reports", str(folder / "reports")),
    ]


def statuses(folder: Path) -> dict[str, str]:
    audit = json.loads((folder / "reports" / "audit.json").read_text())
    return {m["id"]: m["status"] for m in audit["mutants"]}


def verdict_files(folder: Path) -> int:
    return len(list((folder / "cache" / "results").glob("*.json")))


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention ``text`` (from /proc: no pgrep needed)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it ended while we looked
            continue
        if text in words:
            found.append(words)
    return found


def project(tmp_path: Path, name: str) -> Path:
    """A folder with its own cache (vLLM's tests only) and a configuration holding this
    repository's equivalents, and no gate. No catalogue: most of its entries survive
    vLLM's suite, and each survivor runs every covering test, which made these runs the
    slowest of the suite; resuming works on mutmut's mutants and the catalogue's alike."""
    folder = tmp_path / name
    folder.mkdir()
    private_cache(folder)
    (folder / "pyproject.toml").write_text(
        "[tool.fence-audit]\n"
        f'catalogue = "{folder / "no-catalogue"}"\n'
        f'equivalents = "{ROOT / "mutants" / "equivalents.toml"}"\n'
    )
    (folder / "no-catalogue").mkdir()
    return folder


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = project(tmp_path_factory.mktemp("clean"), "run")
    result = fence_audit(*command(folder), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    judged = statuses(folder)
    assert len(judged) > 15  # the removal region's mutmut mutants: 18 on 0.33.0 and 0.34.0
    assert "error" not in judged.values()
    return judged


def baseline_running(folder: Path) -> bool:
    log = folder / "reports" / "logs" / "baseline.log"
    return log.is_file() and log.stat().st_size > 200


def early_mutants(folder: Path) -> bool:
    return verdict_files(folder) >= 2


def late_mutants(folder: Path) -> bool:
    return verdict_files(folder) >= 12


def reports_written(folder: Path) -> bool:
    return (folder / "reports" / "audit.json").is_file()


POINTS: dict[str, Callable[[Path], bool]] = {
    "baseline": baseline_running,
    "early mutants": early_mutants,
    "late mutants": late_mutants,
    "report writing": reports_written,
}
CASES = [
    # a cancelled CI job; fence-audit turns SIGTERM into the Ctrl-C it then handles,
    # so this is also the baseline's Ctrl-C case
    ("baseline", signal.SIGTERM),
    ("late mutants", signal.SIGINT),
    ("report writing", signal.SIGINT),
    ("early mutants", signal.SIGKILL),  # Ctrl-C mid-judging is the late-mutants case
]
# Each case costs a baseline or two (about a minute and a half): these four keep
# `nox -s tests` within CI's budget, which the release and pull-request tests share.


@pytest.mark.parametrize(
    ("point", "signum"), CASES, ids=[f"{p}-{signal.Signals(s).name}" for p, s in CASES]
)
def test_an_interrupted_run_resumes_to_the_clean_run_s_statuses(
    clean: dict[str, str], tmp_path: Path, point: str, signum: signal.Signals
) -> None:
    folder = project(tmp_path, "run")
    before = installed_sha()
    with (folder / "interrupted.log").open("w") as log:
        # Its own session: Ctrl-C from a terminal reaches the whole process group.
        process = subprocess.Popen(
            [sys.executable, "-m", "audit", *command(folder)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 300
        while not POINTS[point](folder) and process.poll() is None:
            assert time.monotonic() < deadline, f"never reached {point}"
            time.sleep(0.05)
        if signum == signal.SIGINT:
            os.killpg(process.pid, signal.SIGINT)
        else:  # fence-audit alone: its test process must not outlive it
            os.kill(process.pid, signum)
        code = process.wait(timeout=120)
    output = (folder / "interrupted.log").read_text()
    assert "Traceback" not in output
    stopped = signum in (signal.SIGINT, signal.SIGTERM)
    if stopped and point != "report writing":
        assert code == 130, output
        assert "interrupted" in output
        assert "next: run" in output  # every interruption says how to resume
    if stopped and point in ("early mutants", "late mutants"):
        audit = json.loads((folder / "reports" / "audit.json").read_text())
        judged, total = audit["incomplete"]["judged"], audit["incomplete"]["of"]
        assert judged == len(audit["mutants"]) < total == len(clean)
        assert {m["id"]: m["status"] for m in audit["mutants"]}.items() <= clean.items()
    assert installed_sha() == before
    time.sleep(0.5)  # a test process left behind would show now
    assert processes_mentioning(str(folder)) == [], "test processes outlived the audit"

    resumed = fence_audit(*command(folder), cwd=ROOT)
    assert resumed.returncode == 0, resumed.stderr
    assert statuses(folder) == clean
    assert installed_sha() == before

"""The weekly ratchet: a release's recorded standing (``fence-audit accept``) and the
gate that compares a run with it (``fence-audit gate --standing``), through the real
CLI on saved results files; nothing is re-run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_gate import regions_table

from audit.cli import main
from audit.core.errors import ExitCode

DATA = Path(__file__).parent / "data" / "results.json"
VERSION = json.loads(DATA.read_text())["vllm_version"]


def results(
    folder: Path,
    statuses: dict[str, str],
    *,
    findings: tuple[str, ...] = (),
    killer: str = "tests/test_fence.py::test_flush",
) -> Path:
    """A complete run with one region whose mutants have ``statuses`` (id -> status)."""
    document = json.loads(DATA.read_text())
    template = document["mutants"][0]
    document["mutants"] = [
        {
            **template,
            "id": mutant,
            "region": "population",
            "status": status,
            "killed_by": killer if status == "killed" else None,
        }
        for mutant, status in statuses.items()
    ]
    counts = {s: list(statuses.values()).count(s) for s in ("killed", "survived", "timeout")}
    judged = sum(counts.values())
    tally = {
        **counts,
        "no_tests": 0,
        "error": 0,
        "equivalent": 0,
        "judged": judged,
        "score": round(100 * counts["killed"] / judged, 2),
        "killed_by_vllm": counts["killed"],  # the killer is a test of vLLM's
    }
    document["score"] = tally
    document["regions"] = {"population": {**document["regions"]["population"], **tally}}
    document["findings"] = [
        {"id": f, "title": f, "doc": f"docs/{f}.md", "releases": [VERSION], "tests": []}
        for f in findings
    ]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "audit.json"
    path.write_text(json.dumps(document))
    (folder / "pyproject.toml").write_text(regions_table(path))
    return path


def accept(path: Path, standings: Path, *reasons: str) -> int:
    config = path.parent / "pyproject.toml"
    args = ["accept", "--config", str(config), "--results", str(path)]
    args += ["--standings", str(standings)]
    for reason in reasons:
        args += ["--reason", reason]
    return main(args)


def gate(path: Path, *args: str) -> int:
    """The gate at a 100% threshold, with ``args`` (``--standing DIR``)."""
    config = path.parent / "pyproject.toml"
    return main(
        ["gate", "--config", str(config), "--results", str(path), "--fail-under", "100", *args]
    )


RECORDED = {"m0": "killed", "m1": "killed", "m2": "killed", "m3": "survived"}


@pytest.fixture
def standings(tmp_path: Path) -> Path:
    """A standing of 3 killed of 4, m3 accepted alive, one finding."""
    folder = tmp_path / "standings"
    path = results(tmp_path / "accepted", RECORDED, findings=("bug-a",))
    assert accept(path, folder, "m3=equivalent in all but name") == ExitCode.OK
    return folder


def test_accept_records_scores_killers_survivors_and_findings(standings: Path) -> None:
    recorded = json.loads((standings / f"vllm-{VERSION}.json").read_text())
    assert recorded["score"] == {"killed": 3, "judged": 4, "killed_by_vllm": 3}
    assert recorded["regions"] == {"population": {"killed": 3, "judged": 4, "killed_by_vllm": 3}}
    assert recorded["killed"] == dict.fromkeys(
        ["m0", "m1", "m2"], "tests/test_fence.py::test_flush"
    )
    assert recorded["alive"] == {
        "m3": {"status": "survived", "reason": "equivalent in all but name"}
    }
    assert recorded["findings"] == ["bug-a"]


def test_a_survivor_without_a_reason_is_not_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = results(tmp_path / "run", RECORDED)
    assert accept(path, tmp_path / "standings") == ExitCode.USAGE
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "Traceback" not in error
    assert "m3 is survived" in error
    assert "--reason 'm3=WHY'" in error
    assert not (tmp_path / "standings").exists()


def test_a_recorded_reason_is_kept_when_the_standing_is_recorded_again(
    tmp_path: Path, standings: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = results(tmp_path / "again", RECORDED, findings=("bug-a",))
    assert accept(path, standings) == ExitCode.OK
    assert "review it as a diff in a pull request" in capsys.readouterr().out
    recorded = json.loads((standings / f"vllm-{VERSION}.json").read_text())
    assert recorded["alive"]["m3"]["reason"] == "equivalent in all but name"


def test_what_was_recorded_remaining_passes(
    tmp_path: Path, standings: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = results(tmp_path / "week", RECORDED, findings=("bug-a",))
    assert gate(path, "--standing", str(standings)) == ExitCode.OK
    assert "standing of vLLM" in capsys.readouterr().out
    # the thresholds alone would fail this run (75% < the default 100)
    assert gate(path) == ExitCode.SCORE_BELOW_THRESHOLD


@pytest.mark.parametrize(
    ("statuses", "findings", "cause"),
    [
        pytest.param(
            {**RECORDED, "m1": "survived"},
            ("bug-a",),
            "m1 is survived; tests/test_fence.py::test_flush killed it in the standing",
            id="a-killed-mutant-survives",
        ),
        pytest.param(
            {**RECORDED, "m2": "timeout"},
            ("bug-a",),
            "m2 is timeout; tests/test_fence.py::test_flush killed it",
            id="a-killed-mutant-times-out",
        ),
        pytest.param(
            {**RECORDED, "m4": "survived"},
            ("bug-a",),
            "m4 is survived, and the standing does not know it",
            id="a-new-mutant-survives",
        ),
        pytest.param(
            {"m0": "killed", "m1": "killed", "m3": "survived", "m5": "survived"},
            ("bug-a",),
            "the score fell from 75.0% (3 of 4) to 50.0% (2 of 4)",
            id="the-score-falls",
        ),
        pytest.param(
            RECORDED, (), "finding bug-a no longer fails on this release", id="a-finding-goes"
        ),
        pytest.param(
            RECORDED,
            ("bug-a", "bug-b"),
            "finding bug-b now fails on this release",
            id="a-finding-appears",
        ),
    ],
)
def test_each_way_of_getting_worse_fails_and_names_its_cause(
    tmp_path: Path,
    standings: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    statuses: dict[str, str],
    findings: tuple[str, ...],
    cause: str,
) -> None:
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    path = results(tmp_path / "week", statuses, findings=findings)
    code = gate(path, "--standing", str(standings))
    assert code == ExitCode.WORSE_THAN_STANDING
    out = capsys.readouterr().out
    assert f"standing of vLLM {VERSION}: worse" in out
    assert cause in out
    assert cause in summary.read_text()


def test_a_run_that_improves_is_better_and_passes(
    tmp_path: Path, standings: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = results(tmp_path / "week", {**RECORDED, "m3": "killed"}, findings=("bug-a",))
    assert gate(path, "--standing", str(standings)) == ExitCode.OK
    out = capsys.readouterr().out
    assert f"standing of vLLM {VERSION}: better" in out
    assert "m3 is killed (accepted as alive before)" in out
    assert "fence-audit accept" in out


def test_a_release_without_a_standing_is_gated_by_the_thresholds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = results(tmp_path / "new", RECORDED)
    reports = ["--reports", str(tmp_path / "reports")]
    assert gate(path, "--standing", str(tmp_path / "none"), *reports) == 2
    out = capsys.readouterr().out
    assert "no standing of vLLM" in out
    # its first standing is proposed beside the run (a CI artifact), for review
    proposed = json.loads((tmp_path / "reports" / "standing-proposed.json").read_text())
    assert proposed["score"] == {"killed": 3, "judged": 4, "killed_by_vllm": 3}
    assert proposed["alive"]["m3"]["reason"].startswith("not reviewed yet")
    assert f"add it as {tmp_path / 'none' / f'vllm-{VERSION}.json'}" in out


def test_a_damaged_standing_is_one_line_naming_the_file(
    tmp_path: Path, standings: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded = standings / f"vllm-{VERSION}.json"
    document = json.loads(recorded.read_text())
    document["kiled"] = document.pop("killed")
    recorded.write_text(json.dumps(document))
    path = results(tmp_path / "week", RECORDED, findings=("bug-a",))
    assert gate(path, "--standing", str(standings)) == ExitCode.USAGE
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "unknown key 'kiled'" in error
    assert str(recorded) in error

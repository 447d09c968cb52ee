"""The gate, through the real CLI, on saved results files (nothing is re-run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit.cli import main
from audit.core.errors import ConfigError, ExitCode
from audit.results.gate import evaluate
from audit.results.report_model import load_results
from audit.setup.config import GateThresholds, load_config

DATA = Path(__file__).parent / "data" / "results.json"


def results_file(tmp_path: Path, *, survivors: int, timeouts: int = 0, killed: int = 9) -> Path:
    """A results file with one region whose mutants have the given statuses."""
    document = json.loads(DATA.read_text())
    template = document["mutants"][0]
    statuses = ["killed"] * killed + ["survived"] * survivors + ["timeout"] * timeouts
    document["mutants"] = [
        {**template, "id": f"m{i}", "region": "population", "status": status}
        for i, status in enumerate(statuses)
    ]
    judged = len(statuses)
    tally = {
        "killed": killed,
        "survived": survivors,
        "timeout": timeouts,
        "no_tests": 0,
        "error": 0,
        "judged": judged,
        "score": round(100 * killed / judged, 2),
        "equivalent": 0,
        "killed_by_vllm": killed,  # the template's killer is a test of vLLM's
    }
    document["score"] = tally
    document["regions"] = {"population": {**document["regions"]["population"], **tally}}
    path = tmp_path / "audit.json"
    path.write_text(json.dumps(document))
    return path


def gate(path: Path, *args: str) -> int:
    # --config: this project's own pyproject (thresholds) must not leak into the test.
    # Its regions are those of the results (a run of every configured region).
    config = path.parent / "pyproject.toml"
    config.write_text(regions_table(path))
    return main(["gate", "--config", str(config), "--results", str(path), *args])


def regions_table(path: Path) -> str:
    names = json.loads(path.read_text())["regions"] if path.is_file() else {"population": 0}
    return "".join(
        f'[tool.fence-audit.regions.{name}]\nselect = [{{ function = "Fence.f" }}]\n'
        for name in names
    )


def test_gate_fails_with_2_when_one_survivor_misses_100(tmp_path: Path) -> None:
    path = results_file(tmp_path, survivors=1)
    assert gate(path, "--fail-under", "100") == ExitCode.SCORE_BELOW_THRESHOLD == 2


def test_gate_passes_when_the_threshold_is_met(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = results_file(tmp_path, survivors=1)  # 9 of 10: 90%
    assert gate(path, "--fail-under", "90") == ExitCode.OK == 0
    assert "score: 90.00% (9 killed of 10 judged), required 90%: ok" in capsys.readouterr().out


def test_gate_100_means_exactly_100(tmp_path: Path) -> None:
    path = results_file(tmp_path, survivors=1, killed=99_999)  # 99.999% rounds to 100.00
    assert gate(path, "--fail-under", "100") == 2
    assert gate(results_file(tmp_path, survivors=0), "--fail-under", "100") == 0


def test_gate_fails_with_3_when_only_timeouts_miss(tmp_path: Path) -> None:
    path = results_file(tmp_path, survivors=0, timeouts=1)
    assert gate(path, "--fail-under", "95") == ExitCode.TIMEOUTS_ONLY == 3
    mixed = results_file(tmp_path, survivors=1, timeouts=1)
    assert gate(mixed, "--fail-under", "95") == 2


def test_gate_checks_each_region_and_line_coverage(tmp_path: Path) -> None:
    results = load_results(DATA)  # removal: 1 killed, 1 survived, 1 timeout; 3 of 4 lines
    assert evaluate(results, GateThresholds(regions=(("removal", 70.0),))).exit_code == 2
    # 34% would be met had the timeout been killed (2 of 3): timeouts only
    assert evaluate(results, GateThresholds(regions=(("removal", 34.0),))).exit_code == 3
    assert evaluate(results, GateThresholds(regions=(("removal", 33.0),))).exit_code == 0
    assert evaluate(results, GateThresholds(min_line_coverage=75)).exit_code == 0
    lines = evaluate(results, GateThresholds(min_line_coverage=76))
    assert lines.exit_code == 2
    assert "line coverage of removal: 75.00% (3 of 4 lines), required 76%: FAILED" in lines.render()


def test_gate_region_threshold_from_the_command_line(tmp_path: Path) -> None:
    path = DATA
    assert gate(tmp_path / "x.json", "--fail-under", "1") == ExitCode.USAGE  # no file
    copied = tmp_path / "audit.json"
    copied.write_text(path.read_text())
    assert gate(copied, "--fail-under-region", "removal=70") == 2
    assert gate(copied, "--fail-under-region", "removal=33") == 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--fail-under", "101"), "--fail-under is 101.0: a threshold lies between 0 and 100"),
        (("--fail-under", "-1"), "--fail-under is -1.0: a threshold lies between 0 and 100"),
        (("--fail-under-region", "removal"), "'removal' is not of the form NAME=PERCENT"),
        (("--fail-under-region", "removal=lots"), "'removal=lots' is not of the form"),
        (("--fail-under-region", "nowhere=50"), "names region 'nowhere', which is neither"),
    ],
)
def test_gate_rejects_bad_thresholds_with_usage_error(
    tmp_path: Path, args: tuple[str, ...], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    copied = tmp_path / "audit.json"
    copied.write_text(DATA.read_text())
    assert gate(copied, *args) == ExitCode.USAGE
    assert says in capsys.readouterr().err


def test_gate_thresholds_come_from_pyproject(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        "[tool.fence-audit.gate]\nfail-under = 40\nmin-line-coverage = 70\n"
        "regions = { removal = 30 }\n" + regions_table(DATA)
    )
    config = load_config(pyproject)
    assert config.gate == GateThresholds(40.0, (("removal", 30.0),), 70.0)
    copied = tmp_path / "audit.json"
    copied.write_text(DATA.read_text())
    assert main(["gate", "--config", str(pyproject), "--results", str(copied)]) == 0
    pyproject.write_text("[tool.fence-audit.gate]\nfail-under = 70\n" + regions_table(DATA))
    assert main(["gate", "--config", str(pyproject), "--results", str(copied)]) == 2


@pytest.mark.parametrize(
    "body", ["fail-under = 120", 'fail-under = "high"', "fail_under = 50", "regions = 3"]
)
def test_a_broken_gate_table_names_the_key(tmp_path: Path, body: str) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(f"[tool.fence-audit.gate]\n{body}\n")
    with pytest.raises(ConfigError) as error:
        load_config(pyproject)
    assert str(pyproject) in error.value.render()


def test_project_gate_is_configured(project_root: Path) -> None:
    gate = load_config(project_root / "pyproject.toml").gate
    assert gate.fail_under > 0
    assert dict(gate.regions).keys() == {"population", "flush", "removal", "sliding_window"}


def test_a_run_of_some_regions_checks_only_those(tmp_path: Path) -> None:
    results = load_results(DATA)  # regions population and removal
    thresholds = GateThresholds(fail_under=99, regions=(("removal", 30.0), ("flush", 99.0)))
    outcome = evaluate(results, thresholds, ("population", "removal", "flush"))
    assert outcome.exit_code == 0  # overall and flush not checked: the run left flush out
    assert outcome.overall_skipped
    assert outcome.not_run == ("flush",)
    assert "score of flush: not checked" in outcome.render()
    everything = GateThresholds(fail_under=99, regions=(("removal", 30.0),))
    full = evaluate(results, everything, ("population", "removal"))
    assert full.exit_code == 2  # every configured region ran: the overall score counts

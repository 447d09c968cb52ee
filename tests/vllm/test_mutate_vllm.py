"""``fence-audit mutate`` on the configured vLLM: verdicts, the cache, and a run killed mid-way."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from fence_helpers import VLLM_VERSION, Result, fence_audit, private_cache
from stryker_schema import published_schema

from audit.core import environment
from audit.setup.config import default_cache_dir

TARGET = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"
REGION = "population"  # big enough that fixed costs do not swamp the timing checks


def installed_sha() -> str:
    return environment.sha256_file(
        environment.installed_file(environment.installed_vllm(VLLM_VERSION), TARGET)
    )


def mutate(cache: Path, reports: Path, *extra: str) -> Result:
    return fence_audit(
        "mutate",
        "--region",
        REGION,
        "--cache-dir",
        str(cache),
        "--reports",
        str(reports),
        *extra,
        cwd=Path.cwd(),
    )


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Result, dict]:  # type: ignore[type-arg]
    tmp = tmp_path_factory.mktemp("mutate")
    cache = private_cache(tmp)
    reports = tmp / "reports"
    result = mutate(cache, reports)
    audit = json.loads((reports / "audit.json").read_text())
    return cache, reports, result, audit


def test_every_in_region_mutant_is_judged(first_run) -> None:  # type: ignore[no-untyped-def]
    _, _, result, audit = first_run
    assert result.returncode == 0, result.stderr
    assert audit["format"] == 3
    assert audit["vllm_version"] == VLLM_VERSION
    mutants = audit["mutants"]
    assert mutants
    assert {m["region"] for m in mutants} == {REGION}
    assert {m["origin"] for m in mutants} == {"mutmut", "catalogue"}
    entries = {e["id"] for e in audit["catalogue"] if e["region"] == REGION}
    assert entries == {m["id"] for m in mutants if m["origin"] == "catalogue"}
    for mutant in mutants:
        if mutant["origin"] == "catalogue":
            assert mutant["title"]
            assert mutant["verdict"]
        assert mutant["status"] in {"killed", "survived", "timeout", "no_tests"}, mutant
        if mutant["status"] == "killed":
            assert mutant["killed_by"] in [audit["tests"][i] for i in mutant["covered_by"]]
            assert mutant["failure"]
        assert mutant["diff"].startswith("--- a/scheduler.py")
    tally = audit["regions"][REGION]
    assert tally["killed"] + tally["survived"] + tally["timeout"] == tally["judged"] > 0
    assert audit["out_of_region"]


def test_mutate_writes_every_report_and_ends_with_the_gate(first_run) -> None:  # type: ignore[no-untyped-def]
    _, reports, result, audit = first_run
    for name in ("index.html", "summary.md", "junit.xml", f"regions/{REGION}.html"):
        assert (reports / name).stat().st_size > 0, name
    index = (reports / "index.html").read_text()
    assert f"{audit['score']['score']:.1f}%" in index
    last = result.stdout.strip().splitlines()[-1]
    assert str(reports / "index.html") in last
    assert "gate" in last
    page = (reports / "regions" / f"{REGION}.html").read_text()
    assert page.count('<details class="mutant') == len(audit["mutants"])


def test_the_stryker_report_is_valid_under_the_published_schema(first_run) -> None:  # type: ignore[no-untyped-def]
    _, reports, _, audit = first_run
    report = json.loads((reports / "mutation.json").read_text())
    jsonschema.validate(report, published_schema(default_cache_dir() / "schemas"))
    (file,) = report["files"].values()
    assert len(file["mutants"]) == len(audit["mutants"])


def test_installed_scheduler_is_unchanged(first_run) -> None:  # type: ignore[no-untyped-def]
    _, _, result, audit = first_run
    assert audit["target"]["sha256"] == installed_sha() == environment.recorded_sha256(TARGET)
    assert f"unchanged (sha256 {installed_sha()})" in result.stdout


def test_a_second_run_judges_nothing_again(first_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cache, _, _, audit = first_run
    again = mutate(cache, tmp_path / "reports")
    assert again.returncode == 0, again.stderr
    assert "baseline read from the cache" in again.stdout  # no test process at all
    second = json.loads((tmp_path / "reports" / "audit.json").read_text())
    judged = [m for m in second["mutants"] if m["status"] != "no_tests"]
    assert all(m["cached"] for m in judged)
    assert {m["id"]: m["status"] for m in second["mutants"]} == {
        m["id"]: m["status"] for m in audit["mutants"]
    }


def test_two_runs_from_an_empty_cache_agree(first_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, _, _, audit = first_run
    fresh = mutate(private_cache(tmp_path), tmp_path / "reports")
    assert fresh.returncode == 0, fresh.stderr
    second = json.loads((tmp_path / "reports" / "audit.json").read_text())
    assert not any(m["cached"] for m in second["mutants"])
    assert {m["id"]: m["status"] for m in second["mutants"]} == {
        m["id"]: m["status"] for m in audit["mutants"]
    }


# A run stopped by SIGINT, SIGTERM or SIGKILL at several points, then resumed:
# tests/faults/test_interrupts.py.

"""``fence-audit coverage`` on the configured vLLM with vLLM's own fence tests, end to end."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from fence_helpers import FENCE_TESTS, VLLM_VERSION, Result, fence_audit

from audit.core import environment
from audit.setup.config import load_config

# Every fence-related test fence-brief section 10 names (all exist in vLLM 0.33.0 and 0.34.0).
FENCE_REGRESSION_TESTS = (
    "test_request_preemption",
    "test_concurrent_lookups_of_the_same_prefix",
    "test_request_level_policy_stores_all_blocks",
    "test_loads_do_not_populate_fence_index",
    "test_fence_at_update_state_after_alloc",
    "test_fence_at_build_store_jobs",
    "test_request_finished_with_pending_stores_populates_fence",
    "test_multiple_in_flight_stores_all_flushed_by_fence",
    "test_request_finished_mixed_full_attn_and_sliding_window",
    "test_stale_sliding_window_block_after_prepare_store_failure",
    "test_two_groups_full_and_sliding_window",
    "test_reset_cache",
    "test_reset_cache_finalizes_finished_request_with_pending_store",
    "test_async_preempt_readmit_before_transfer_output_is_deferred",
    "test_max_offload_tokens_validation",
    "test_swa_alignment_skip",
)
TARGET = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> tuple[Result, Path, str]:
    reports = tmp_path_factory.mktemp("reports")
    installed = environment.installed_file(environment.installed_vllm(VLLM_VERSION), TARGET)
    before = environment.sha256_file(installed)
    # A user whose home and Hugging Face cache must stay untouched by the audit.
    user = tmp_path_factory.mktemp("user")
    env = {
        **os.environ,
        "HOME": str(user),
        "HF_HOME": str(user / "hf-home"),
        "FENCE_AUDIT_CACHE": str(load_config().cache_dir),  # the sdist, fetched once
    }
    result = fence_audit("coverage", "--reports", str(reports), cwd=Path.cwd(), env=env)
    assert not list(user.iterdir()), "the audit wrote into the user's home or HF cache"
    return result, reports, before


def test_coverage_ends_with_the_region_table(audited) -> None:  # type: ignore[no-untyped-def]
    result, _, _ = audited
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("\n\n")[-1]
    assert table.splitlines()[0].split() == ["region", "functions", "lines", "branches", "tests"]
    assert [row.split()[0] for row in table.splitlines()[2:]] == [
        "population",
        "flush",
        "removal",
        "sliding_window",
    ]


def test_regions_json_holds_four_regions_with_lines(audited) -> None:  # type: ignore[no-untyped-def]
    _, reports, _ = audited
    regions = json.loads((reports / "regions.json").read_text())["regions"]
    assert set(regions) == {"population", "flush", "removal", "sliding_window"}
    for region in regions.values():
        assert region["lines"]["total"] > 0
        assert 0 < region["lines"]["covered"] <= region["lines"]["total"]
        assert region["tests"]


def test_every_fence_regression_test_is_a_context_on_fence_lines(audited) -> None:  # type: ignore[no-untyped-def]
    _, reports, _ = audited
    page = next((reports / "coverage").glob("*scheduler_py.html")).read_text()
    regions = json.loads((reports / "regions.json").read_text())["regions"]
    fence_lines = {
        line
        for region in regions.values()
        for span in region["spans"]
        for line in range(span["start"], span["end"] + 1)
    }
    # coverage.py's HTML lists, per line <p id="tN">, the short codes of its contexts;
    # a script block maps each code to the context name (the pytest node id).
    names = json.loads(re.search(r"contexts = (\{.*?\n\s*\})", page, re.S).group(1))  # type: ignore[union-attr]
    contexts_on_fence_lines: set[str] = set()
    for number, codes in re.findall(r'id="t(\d+)".*?<span class="ctxs">(.*?)</span>', page):
        if int(number) not in fence_lines:
            continue
        # coverage.py's encoding: the first character is the code width, then codes.
        text = html.unescape(codes)
        width = int(text[0])
        for i in range(1, len(text), width):
            name = names[text[i : i + width].strip()]
            contexts_on_fence_lines.add(name.rpartition("::")[2].split("[")[0])
    missing = [t for t in FENCE_REGRESSION_TESTS if t not in contexts_on_fence_lines]
    assert not missing


def test_installed_scheduler_is_byte_identical_after_the_run(audited) -> None:  # type: ignore[no-untyped-def]
    result, _, before = audited
    installed = environment.installed_file(environment.installed_vllm(VLLM_VERSION), TARGET)
    assert environment.sha256_file(installed) == before
    assert environment.recorded_sha256(TARGET) == before
    assert f"unchanged (sha256 {before})" in result.stdout


def test_a_checkout_is_audited_from_its_own_files(tmp_path: Path, audited) -> None:  # type: ignore[no-untyped-def]
    """--vllm-src: the checkout's tests and target module; the rest is installed vLLM."""
    _, reports, _ = audited
    installed = environment.installed_file(environment.installed_vllm(VLLM_VERSION), TARGET)
    checkout = tmp_path / "vllm-checkout"
    target = checkout / TARGET.replace(".", "/")
    target = target.with_suffix(".py")
    target.parent.mkdir(parents=True)
    # Three lines added at the top: regions must follow the shift.
    target.write_text("# a contributor's branch\n\n\n" + installed.read_text())
    shutil.copytree(_cached_sdist_tests(), checkout / "tests")
    out = tmp_path / "reports"
    result = fence_audit(
        "coverage",
        "--vllm-src",
        str(checkout),
        "--reports",
        str(out),
        "--suite",
        FENCE_TESTS + "::test_fence_at_build_store_jobs",
        cwd=Path.cwd(),
    )
    assert result.returncode == 0, result.stderr
    cmap = json.loads((out / "coverage-map.json").read_text())
    assert cmap["target"]["path"] == str(target.resolve())
    base = json.loads((reports / "regions.json").read_text())["regions"]["removal"]["spans"]
    moved = json.loads((out / "regions.json").read_text())["regions"]["removal"]["spans"]
    assert [s["start"] for s in moved] == [s["start"] + 3 for s in base]
    assert cmap["lines"], "the checkout's file was not the one executed"


def _cached_sdist_tests() -> Path:
    return load_config().cache_dir / "tests" / f"vllm-{VLLM_VERSION}" / "tests"


def test_every_region_figure_equals_coverage_py_s_own_analysis(audited) -> None:  # type: ignore[no-untyped-def]
    """Each region's line and branch figures in regions.json are coverage.py's: its JSON
    report of the same data file, restricted to the region's lines (a multi-line
    statement counts once, by its first line; every exit of a line with two or more)."""
    import coverage

    _, reports, _ = audited
    document = json.loads((reports / "regions.json").read_text())
    target = document["target"]["path"]
    cov = coverage.Coverage(
        data_file=str(reports / ".work" / "baseline.coverage"), branch=True, config_file=False
    )
    cov.load()
    out = reports.parent / "coverage-py.json"
    cov.json_report(outfile=str(out), include=[target])
    (report,) = json.loads(out.read_text())["files"].values()
    for name, region in document["regions"].items():
        lines = {n for s in region["spans"] for n in range(s["start"], s["end"] + 1)}
        executed = set(report["executed_lines"]) & lines
        missing = set(report["missing_lines"]) & lines
        taken = [a for a in report["executed_branches"] if a[0] in lines]
        not_taken = [a for a in report["missing_branches"] if a[0] in lines]
        theirs = {
            "lines": {"covered": len(executed), "total": len(executed | missing)},
            "branches": {"covered": len(taken), "total": len(taken) + len(not_taken)},
            "missed_lines": sorted(missing),
        }
        ours = {key: region[key] for key in theirs}
        assert ours == theirs, name

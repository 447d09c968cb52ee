"""Pull-request mode on a change nobody here wrote: vLLM 0.33.0 -> 0.34.0's scheduler.

A git repository is built from the two releases' sdists (the target module and the
offloading connector's tests, what ``--vllm-src`` needs), 0.34.0 committed on top of
0.33.0; ``fence-audit mutate --vllm-src REPO --since HEAD~1`` then audits 0.34.0's
change in the 0.34.0 environment (the configured release, installed).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from fence_helpers import FENCE_TESTS, VLLM_VERSION, Result, fence_audit

from audit.core import environment
from audit.mutation.mutants import mutant_id
from audit.mutation.mutmut_adapter import generate
from audit.setup import sources
from audit.setup.config import load_config
from audit.setup.regions import resolve_regions

pytestmark = [pytest.mark.vllm, pytest.mark.network]

TARGET = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"
MODULE = environment.module_relpath(TARGET)
# The change audited: a release, then the configured one on top (its after side must be
# the vLLM installed here, whose tests and other modules the audit runs with).
RELEASES = ("0.33.0", "0.34.0")
# 0.34.0 changed three lines of the population region (a store job's keys, now kept in
# prefix order), two of the sliding-window region's (the null-block skip in
# _build_store_jobs, where population's catalogue entry registering the null block
# applies) and much outside every region (the group). The cache-reset test and the
# preemption test's recompute cases reach the population changes. Two of the group's
# mutants (in _lookup) hang every test up to its budget: the preemption test's CPU-hit
# cases, the slowest by far, stay out, which keeps the run near a minute.
REGION = "population"
SUITE = (
    f"{FENCE_TESTS}::test_request_preemption[False-False]",
    f"{FENCE_TESTS}::test_request_preemption[False-True]",
    f"{FENCE_TESTS}::test_prefix_cache_reset_preserves_same_step_offload_reload",
)
GROUP = "changed-outside-regions"
# What --vllm-src needs to run the offloading connector's tests: the package path down
# to them (each __init__.py and conftest.py), the helpers they import (0.34.0's
# test_scheduler.py also imports tests/v1/spec_decode/utils.py), and the tests.
KEPT_FILES = (
    "tests/__init__.py",
    "tests/v1/__init__.py",
    "tests/v1/kv_connector/__init__.py",
    "tests/v1/kv_connector/unit/__init__.py",
    "tests/v1/kv_connector/unit/conftest.py",
    "tests/v1/kv_connector/unit/utils.py",
    "tests/v1/spec_decode/__init__.py",
    "tests/v1/spec_decode/utils.py",
)
KEPT_FOLDER = "tests/v1/kv_connector/unit/offloading_connector/"


def release_files(version: str) -> dict[str, bytes]:
    """The target module and the fence tests as vLLM ``version``'s sdist ships them,
    through the audit's own fetch (the cache, or the index once: CI downloads it)."""
    config = load_config()
    sources.sdist_archive(version, index_url=config.index_url, cache_dir=config.cache_dir)
    archive = config.cache_dir / "sdist" / f"vllm-{version}.tar.gz"
    top = f"vllm-{version}/"
    files: dict[str, bytes] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            name = member.name.removeprefix(top)
            wanted = name == MODULE or name in KEPT_FILES or name.startswith(KEPT_FOLDER)
            if member.isfile() and wanted:
                extracted = tar.extractfile(member)
                assert extracted is not None
                files[name] = extracted.read()
    assert MODULE in files, f"{archive} has no {MODULE}"
    return files


def git(repo: Path, *args: str) -> str:
    """git with no configuration of the user's or the machine's."""
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "fence-audit",
        "GIT_AUTHOR_EMAIL": "fence-audit@example.invalid",
        "GIT_COMMITTER_NAME": "fence-audit",
        "GIT_COMMITTER_EMAIL": "fence-audit@example.invalid",
        "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
    }
    process = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True
    )
    return process.stdout


def build_checkout(repo: Path) -> Path:
    """A git repository holding 0.33.0's target and fence tests, then 0.34.0's on top."""
    repo.mkdir(parents=True)
    git(repo, "init", "--quiet")
    for version in RELEASES:
        git(repo, "rm", "-r", "--quiet", "--ignore-unmatch", ".")
        for name, data in release_files(version).items():
            path = repo / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        git(repo, "add", "--all")
        git(repo, "commit", "--quiet", "-m", f"vLLM {version}")
    return repo


def diff_lines(repo: Path) -> set[int]:
    """The lines of the target git marks changed since HEAD~1, numbered here by counting
    the diff's added lines: each added line, and the lines on each side of a place where
    lines were only removed (a hunk of size 0 names the line before it)."""
    diff = git(repo, "diff", "--no-color", "--unified=0", "HEAD~1", "--", MODULE)
    length = len((repo / MODULE).read_text().splitlines())
    changed: set[int] = set()
    line = 0
    for text in diff.splitlines():
        if text.startswith("@@"):
            first, _, size = text.split(" +", 1)[1].split(" ", 1)[0].partition(",")
            line = int(first)
            if size == "0":
                changed.update(n for n in (line, line + 1) if 1 <= n <= length)
        elif text.startswith("+") and not text.startswith("+++"):
            changed.add(line)
            line += 1
    return changed


def every_function(text: str) -> set[str]:
    tree = ast.parse(text)
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names |= {
                f"{node.name}.{child.name}"
                for child in node.body
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            }
    return names


@pytest.fixture(scope="module")
def pull_request(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Result, dict]:  # type: ignore[type-arg]
    assert RELEASES[-1] == VLLM_VERSION, f"the change's after side is not vLLM {VLLM_VERSION}"
    tmp = tmp_path_factory.mktemp("since")
    repo = build_checkout(tmp / "vllm")
    reports = tmp / "reports"
    result = fence_audit(
        "mutate",
        "--vllm-src",
        str(repo),
        "--since",
        "HEAD~1",
        *(part for path in SUITE for part in ("--suite", path)),
        "--region",
        REGION,
        "--reports",
        str(reports),
        "-j",
        "2",
        cwd=Path.cwd(),
    )
    assert result.returncode in (0, 2), result.stderr  # 2: the gate, on a narrowed suite
    return repo, reports, result, json.loads((reports / "audit.json").read_text())


def test_since_records_the_ref_its_commit_and_the_changed_lines(pull_request) -> None:  # type: ignore[no-untyped-def]
    repo, _, _, audit = pull_request
    since = audit["since"]
    assert since["ref"] == "HEAD~1"
    assert since["commit"] == git(repo, "rev-parse", "HEAD~1").strip()
    assert since["path"] == since["old_path"] == MODULE
    recorded = {n for first, last in since["lines"] for n in range(first, last + 1)}
    assert recorded == diff_lines(repo)
    assert since["deletions"], "0.34.0 removed code from 0.33.0's scheduler"


def test_only_mutants_on_changed_lines_are_judged(pull_request) -> None:  # type: ignore[no-untyped-def]
    repo, _, _, audit = pull_request
    changed = diff_lines(repo)
    mutants = audit["mutants"]
    assert mutants
    for mutant in mutants:
        assert changed & set(mutant["lines"]), (mutant["id"], mutant["lines"])
        assert mutant["region"] in (REGION, GROUP), mutant["id"]
    assert {m["origin"] for m in mutants if m["region"] == REGION} == {"mutmut", "catalogue"}
    assert audit["out_of_region"] == []


def test_every_mutmut_mutant_on_changed_lines_is_judged(pull_request) -> None:  # type: ignore[no-untyped-def]
    """The filter loses nothing: of every mutmut mutant of the file, those touching a
    changed line are judged, in the run's region or, when no one region holds all their
    lines, in the group; those of the regions the run left out are not."""
    repo, _, _, audit = pull_request
    text = (repo / MODULE).read_text()
    regions = resolve_regions(text, load_config().regions, filename=MODULE, version=RELEASES[-1])
    region_of = {line: r.name for r in regions for line in r.lines}
    changed = diff_lines(repo)
    expected = {}
    for mutation in generate(text, every_function(text)):
        if not changed & set(mutation.changed_lines):
            continue
        owners = {region_of.get(line) for line in mutation.changed_lines}
        if owners == {REGION}:
            expected[mutant_id(mutation)] = REGION
        elif len(owners) != 1 or None in owners:
            expected[mutant_id(mutation)] = GROUP
    judged = {m["id"]: m["region"] for m in audit["mutants"] if m["origin"] == "mutmut"}
    assert judged == expected


def test_the_changed_code_outside_every_region_is_a_group_scored_apart(pull_request) -> None:  # type: ignore[no-untyped-def]
    _, _, _, audit = pull_request
    assert GROUP in audit["regions"]
    group = [m for m in audit["mutants"] if m["region"] == GROUP]
    assert group
    inside = [m for m in audit["mutants"] if m["region"] != GROUP]
    assert audit["score"]["killed"] == sum(m["status"] == "killed" for m in inside)
    assert audit["since"]["score"]["killed"] == sum(
        m["status"] == "killed" for m in audit["mutants"]
    )
    assert audit["regions"][GROUP]["killed"] == sum(m["status"] == "killed" for m in group)


def test_summary_leads_with_the_changed_code_score(pull_request) -> None:  # type: ignore[no-untyped-def]
    _, reports, result, audit = pull_request
    score = audit["since"]["score"]
    summary = (reports / "summary.md").read_text()
    first = summary.splitlines()[0]
    assert first.startswith(
        f"## fence-audit: {score['killed']} of {score['judged']} mutants in the changed code "
        "killed ("
    ), first
    assert "`HEAD~1`" in summary
    assert "### Survivors in the changed code" in summary
    assert f"| {GROUP} |" in summary
    index = (reports / "index.html").read_text()
    assert 'id="changed-score"' in index
    assert (reports / "regions" / f"{GROUP}.html").is_file()
    assert "changed code since HEAD~1" in result.stdout


def test_report_rerenders_a_pull_request_run(pull_request) -> None:  # type: ignore[no-untyped-def]
    _, reports, _, _ = pull_request
    before = (reports / "summary.md").read_text()
    (reports / "summary.md").unlink()
    rendered = fence_audit("report", "--reports", str(reports), cwd=Path.cwd())
    assert rendered.returncode == 0, rendered.stderr
    assert (reports / "summary.md").read_text() == before


def test_the_installed_scheduler_is_untouched(pull_request) -> None:  # type: ignore[no-untyped-def]
    _, _, result, _ = pull_request
    installed = environment.installed_file(environment.installed_vllm(VLLM_VERSION), TARGET)
    digest = environment.sha256_file(installed)
    assert digest == environment.recorded_sha256(TARGET)
    assert f"unchanged (sha256 {digest})" in result.stdout


def test_nothing_changed_judges_nothing_and_says_so(pull_request, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repo = pull_request[0]
    reports = tmp_path / "reports"
    result = fence_audit(
        "mutate",
        "--vllm-src",
        str(repo),
        "--since",
        "HEAD",
        "--reports",
        str(reports),
        cwd=Path.cwd(),
    )
    assert result.returncode == 0, result.stderr
    assert "nothing changed in" in result.stdout
    assert not (reports / "logs" / "baseline.log").exists()  # no test ran
    audit = json.loads((reports / "audit.json").read_text())
    assert audit["mutants"] == []
    assert audit["since"]["lines"] == []
    summary = (reports / "summary.md").read_text()
    assert summary.startswith("## fence-audit: nothing changed in `scheduler.py` since `HEAD`")

"""Shards end to end on the toy target (issue 15, item 4): for N = 1, 2 and 4, every
shard runs its own baseline and judges the mutants dealt to it, as N matrix jobs do,
and ``fence-audit merge`` of their results equals one unsharded run, status for status;
at both scopes (``--scope file`` adds the group scored apart, which the merged overall
score must leave out as ``mutate``'s does).

The pipeline's own stages run (``pipeline.coverage``, ``pipeline.mutate``), with a
catalogue entry and equivalents records in four states; the installed-vLLM check is
pointed at the toy's file, which no vLLM installs.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_toy_mutation import REGIONS, TOY

from audit import pipeline
from audit.cli import main
from audit.core import environment
from audit.core.environment import Fingerprint, InstalledVllm, sha256_file
from audit.judging.jobs import ExecutorOptions
from audit.mutation import scope
from audit.mutation.catalogue_entries import load_catalogue
from audit.mutation.equivalents import Equivalent
from audit.mutation.mutants import build_mutants, function_hashes
from audit.results.shards import Shard, read_costs
from audit.setup.config import SuitePath, load_config
from audit.setup.model import Target
from audit.setup.regions import Region, resolve_regions
from audit.setup.sources import TestSource

# No verdict is read from the cache: every run, and every shard, judges its mutants.
OPTIONS = ExecutorOptions(jobs=2, timeout_min_s=1.0, timeout_factor=10.0, use_cache=False)
SUITE = (SuitePath("vllm", "tests/test_fence.py"),)
ENTRY = """format = 1
id = "register-null-block-fenced"
region = "population"
title = "the null block is fenced too"
bug = "The null-block check is gone."
invariant = "I1"
symptom = "Block 0 holds a job."
expected = "vllm"

[[change]]
function = "Fence.register"
statement = "if block == 0"
action = "delete"
"""
# Fields a judging sets that may differ between two runs of the same mutants: the
# clock, the cache, and the killer named (the pool tries first the tests that killed
# most mutants of the function so far in the run, and a shard's run is shorter).
VOLATILE = ("duration_s", "tests_run", "killed_by", "failure", "cached")


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> pipeline.Prepared:
    root = tmp_path / "toy"
    shutil.copytree(TOY, root)
    monkeypatch.setenv("PYTHONPATH", str(root))
    path = root / "toypkg" / "fence.py"
    digest = sha256_file(path)
    monkeypatch.setattr(environment, "verify_untouched", lambda *_: Fingerprint(path, digest))
    catalogue = tmp_path / "catalogue"
    catalogue.mkdir()
    (catalogue / "register-null-block-fenced.toml").write_text(ENTRY)
    config = dataclasses.replace(
        load_config(),
        target="toypkg.fence",
        regions=REGIONS,
        cache_dir=tmp_path / "cache",
        project_dir=tmp_path,
        offline_models=(),
    )
    text = path.read_text()
    regions = resolve_regions(text, REGIONS, filename=str(path))
    return pipeline.Prepared(
        config,
        InstalledVllm("toy", root),
        TestSource(root=root, origin="toy"),
        Target("toypkg.fence", path, path, digest),
        regions,
        Fingerprint(path, digest),
        load_catalogue(catalogue),
        equivalents(text, str(path), regions),
    )


def equivalents(text: str, filename: str, regions: tuple[Region, ...]) -> tuple[Equivalent, ...]:
    """Records in four states, each of a mutant of another function: ``drain``'s weak
    survivor (applied), a killed ``register`` mutant (killed), a ``flush`` mutant
    reviewed against other code (expired), and one the run does not have (absent)."""
    mutants = build_mutants(text, filename, regions, {}).mutants
    hashes = function_hashes(text, ("Fence.drain", "Fence.register"))
    weak = next(m for m in mutants if "+        steps = 1" in m.diff)
    killed = next(m for m in mutants if m.function == "Fence.register")
    expired = next(m for m in mutants if m.function == "Fence.flush")
    return (
        Equivalent(weak.id, hashes["Fence.drain"], "drain's test only counts to 3.", "today"),
        Equivalent("Fence.drain:gone@1:0-1:1#0", "0" * 64, "Gone since.", "today"),
        Equivalent(killed.id, hashes["Fence.register"], "Thought equivalent.", "today"),
        Equivalent(expired.id, "0" * 64, "Reviewed on older code.", "today"),
    )


def audit(
    prepared: pipeline.Prepared,
    reports: Path,
    shard: Shard | None = None,
    costs: dict[str, float] | None = None,
) -> Path:
    """``fence-audit mutate [--shard K/N --shard-costs ...]`` into ``reports``."""
    config = dataclasses.replace(prepared.config, reports_dir=reports)
    stage = pipeline.coverage(dataclasses.replace(prepared, config=config), SUITE)
    pipeline.mutate(stage, OPTIONS, (), "fork", shard, costs)
    return reports / "audit.json"


def without_volatile(document: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in document.items() if k not in ("started_at", "duration_s")}
    kept["mutants"] = [
        {k: v for k, v in m.items() if k not in VOLATILE} for m in document["mutants"]
    ]
    return kept


def whole_module(prepared: pipeline.Prepared) -> pipeline.Prepared:
    """``prepared`` at ``--scope file``: the group of the code outside every region too."""
    text = prepared.target.path.read_text()
    group = scope.outside_regions_group(text, prepared.regions)
    return dataclasses.replace(prepared, scope=scope.FILE, regions=(*prepared.regions, group))


@pytest.mark.parametrize("scoped", [scope.REGIONS, scope.FILE])
def test_the_merge_of_n_shards_equals_one_unsharded_run(
    toy: pipeline.Prepared, tmp_path: Path, scoped: str
) -> None:
    if scoped == scope.FILE:  # the group scored apart must stay apart in the merge
        toy = whole_module(toy)
    whole = json.loads(audit(toy, tmp_path / "whole").read_text())
    statuses = {m["id"]: m["status"] for m in whole["mutants"]}
    if scoped == scope.FILE:
        assert scope.OUTSIDE_REGIONS in {m["region"] for m in whole["mutants"]}
    assert {"killed", "timeout", "no_tests", "equivalent"} <= set(statuses.values())
    assert "catalogue:register-null-block-fenced" in statuses
    states = [e["state"] for e in whole["equivalents"]]
    assert sorted(states) == ["absent", "applied", "expired", "killed"]
    # The durations every shard deals by: the unsharded run's coverage map, as CI's
    # first job writes one for the matrix.
    costs = read_costs(tmp_path / "whole" / "coverage-map.json")
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.fence-audit]\n")
    for count in (1, 2, 4):
        folder = tmp_path / f"{count}-shards"
        paths = [
            audit(toy, folder / f"shard-{k}", Shard(k, count), costs) for k in range(1, count + 1)
        ]
        shards = [json.loads(path.read_text()) for path in paths]
        dealt = [[m["id"] for m in shard["mutants"]] for shard in shards]
        assert sorted(i for ids in dealt for i in ids) == sorted(statuses)
        assert all(dealt) or count > len(statuses)  # each shard judged a part
        assert all(s["shard"]["count"] == count for s in shards)
        merged_reports = folder / "merged"
        args = ["merge", "--config", str(config), "--reports", str(merged_reports)]
        assert main([*args, *map(str, reversed(paths))]) == 0
        merged = json.loads((merged_reports / "audit.json").read_text())
        assert [(m["id"], m["status"]) for m in merged["mutants"]] == list(statuses.items())
        assert merged["score"] == whole["score"]
        assert merged["regions"] == whole["regions"]
        assert merged["equivalents"] == whole["equivalents"]
        assert without_volatile(merged) == without_volatile(whole)
        assert (merged_reports / "index.html").is_file()


def test_a_second_baseline_with_nothing_changed_is_read_from_the_cache(
    toy: pipeline.Prepared, tmp_path: Path
) -> None:
    config = dataclasses.replace(toy.config, reports_dir=tmp_path / "reports")
    prepared = dataclasses.replace(toy, config=config)
    first = pipeline.coverage(prepared, SUITE, reuse=True, workers=2)
    first.close()
    assert not first.reused
    again = pipeline.coverage(prepared, SUITE, reuse=True, workers=2)
    again.close()
    assert again.reused
    assert again.warm is None
    assert again.rerun == ()
    assert [t.test_id for t in again.run.tests] == [t.test_id for t in first.run.tests]

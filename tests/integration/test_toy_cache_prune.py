"""Pruning the cache after a run keeps all the run used: the next run with nothing
changed reads its baseline and every verdict back, and starts no test process."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path

from test_toy_shards import SUITE, toy  # noqa: F401  (the fixture)

from audit import pipeline
from audit.core import cache
from audit.core.protocol import MutantStatus
from audit.judging.jobs import ExecutorOptions

OPTIONS = ExecutorOptions(jobs=2, timeout_min_s=1.0, timeout_factor=10.0)


def from_cache(stage: pipeline.MutationStage) -> set[bool]:
    """Whether each verdict was read from the cache (a mutant no test reaches needs none)."""
    return {v.cached for v in stage.verdicts.values() if v.status != MutantStatus.NO_TESTS}


def run(prepared: pipeline.Prepared) -> pipeline.MutationStage:
    stage = pipeline.coverage(prepared, SUITE, reuse=True, workers=2)
    return pipeline.mutate(stage, OPTIONS)


def test_a_prune_after_a_run_keeps_what_the_next_run_needs(
    toy: pipeline.Prepared,  # noqa: F811
    tmp_path: Path,
) -> None:
    prepared = dataclasses.replace(
        toy, config=dataclasses.replace(toy.config, reports_dir=tmp_path / "reports")
    )
    root = prepared.config.cache_dir
    cache.mark(root)  # as pipeline.prepare does (the toy is prepared by hand)
    first = run(prepared)
    assert from_cache(first) == {False}
    # Everything is 40 days old; beside it, an entry of another run of as many days.
    verdict = next(root.glob("results/*.json"))
    other = shutil.copyfile(verdict, root / "results" / f"{'e' * 32}.json")
    long_ago = time.time() - 40 * cache.DAY_S
    for entry in cache.contents(root).entries:
        os.utime(entry.path, (long_ago, long_ago))

    second = run(prepared)  # reads all back, and stamps what it reads
    assert second.coverage.reused
    assert from_cache(second) == {True}
    removed = cache.prune(root, 30)
    assert [e.path for e in removed] == [other]

    third = run(prepared)
    assert third.coverage.reused
    assert third.coverage.warm is None  # no test process started
    assert from_cache(third) == {True}
    statuses = {k: v.status for k, v in third.verdicts.items()}
    assert statuses == {k: v.status for k, v in first.verdicts.items()}

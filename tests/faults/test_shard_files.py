"""``fence-audit merge`` on shards that do not make one run (issue 15, item 4): shards of
other runs, a missing or doubled shard, an interrupted one, baselines that disagree,
mutants dealt twice or not at all. Each is one line, the README's exit code, and no
audit.json written.

The shards are made by hand from ``tests/unit/data/results.json``
(``tests/shard_documents.py``) and spoiled one field at a time.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from shard_documents import ABSENT, COSTS, THREE, retally, run_ids, save, split, whole_run

from audit.cli import main
from audit.core.errors import ConfigError, ExitCode
from audit.core.outputs import MANIFEST, MANIFEST_FORMAT
from audit.results.merge import merged_document, read_part

Shards = list[dict[str, Any]]


def merge(tmp_path: Path, paths: list[Path], reports: Path | None = None, *args: str) -> int:
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.fence-audit]\n")
    folder = reports or tmp_path / "reports"
    return main(
        ["merge", "--config", str(config), "--reports", str(folder), *map(str, paths), *args]
    )


def said(capsys: pytest.CaptureFixture[str]) -> str:
    """What merge printed on stderr: one line, what failed, where and what to do."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("fence-audit: "), err
    assert err.count("\n") == 1, err
    return err


def three() -> Shards:
    return split(whole_run(), THREE)


def other_run(change: Callable[[dict[str, Any]], None]) -> Callable[[Shards], Shards]:
    """Shard 2 replaced by shard 2 of a run whose document ``change`` altered."""

    def spoil(shards: Shards) -> Shards:
        run = whole_run()
        change(run)
        shards[1] = split(run, THREE)[1]
        return shards

    return spoil


def in_shard(index: int, change: Callable[[dict[str, Any]], object]) -> Callable[[Shards], Shards]:
    def spoil(shards: Shards) -> Shards:
        change(shards[index - 1])
        return shards

    return spoil


def more_mutants(run: dict[str, Any]) -> None:
    extra = copy.deepcopy(run["mutants"][0])
    extra["id"] = "Fence.register:swap_op@4:0-4:1#0"
    run["mutants"].append(extra)
    retally(run)


def set_target(sha: str) -> Callable[[dict[str, Any]], None]:
    return lambda run: run["target"].update(sha256=sha)


def four_shards(shards: Shards) -> Shards:
    """Shard 2 of the same run dealt over four."""
    deal = (THREE[0], THREE[1][:2], THREE[1][2:], THREE[2])
    return [shards[0], split(whole_run(), deal)[1], shards[2]]


def other_durations(shards: Shards) -> Shards:
    shards[2]["shard"]["costs"] = "d1" * 32
    return shards


def dealt_twice(shards: Shards) -> Shards:
    """Shards 1 and 2 of two deals (each shard timed its own baseline)."""
    other = (THREE[0] + THREE[1][:1], THREE[1][1:], THREE[2])
    return [split(whole_run(), other)[0], *shards[1:]]


def dealt_to_none(shards: Shards) -> Shards:
    other = (THREE[0][:2], THREE[0][2:] + THREE[1], THREE[2])
    return [split(whole_run(), other)[0], *shards[1:]]


def absent_reason(shard: dict[str, Any]) -> None:
    next(e for e in shard["equivalents"] if e["id"] == ABSENT)["reason"] = "Another reason."


REFUSALS: list[tuple[str, Callable[[Shards], Shards], str]] = [
    (
        "vllm",
        other_run(lambda run: run.update(vllm_version="0.32.0")),
        "the shards are not of one run: they differ in their vLLM version",
    ),
    (
        "target",
        other_run(set_target("ab" * 32)),
        "the shards are not of one run: they differ in their target",
    ),
    (
        "suite",
        other_run(lambda run: run["suite"]["paths"].pop()),
        "the shards are not of one run: they differ in their suite",
    ),
    (
        "tool",
        other_run(lambda run: run["tool"].update(version="0.2.0")),
        "the shards are not of one run: they differ in their fence-audit version",
    ),
    (
        "regions",
        other_run(
            lambda run: run["regions"].update(flush=copy.deepcopy(run["regions"]["removal"]))
        ),
        "the shards are not of one run: they differ in their regions",
    ),
    (
        "mutants",
        other_run(more_mutants),
        "the shards are not of one run: they differ in their mutants of the run",
    ),
    (
        "count",
        four_shards,
        "the shards are not of one run: they differ in their number of shards",
    ),
    (
        "costs",
        other_durations,
        "the shards are not of one run: they differ in their test durations the mutants "
        "were dealt by",
    ),
    (
        "missing",
        lambda shards: shards[:1] + shards[2:],
        "shard 2/3 missing: the run was dealt over 3 shards",
    ),
    ("twice", lambda shards: [*shards, shards[0]], "shard 1/3 is given twice"),
    (
        "coverage",
        in_shard(2, lambda s: s["regions"]["population"]["lines"].update(covered=3)),
        "shard 2/3 differs from shard 1/3 in regions.population, which the baseline decides "
        "alike in every shard",
    ),
    (
        "source",
        in_shard(3, lambda s: s["source"]["functions"][0]["lines"][0].update(tests=[])),
        "shard 3/3 differs from shard 1/3 in source.functions, which the baseline decides",
    ),
    (
        "catalogue",
        in_shard(2, lambda s: s["catalogue"][0].update(state="stale", reason="gone")),
        "shard 2/3 differs from shard 1/3 in catalogue, which the baseline decides",
    ),
    (
        "dealt-twice",
        dealt_twice,
        "mutant Fence.register:swap_op@3:29-3:36#1 was dealt to shard 1/3 and to shard 2/3",
    ),
    (
        "dealt-to-none",
        dealt_to_none,
        "1 mutants of the run were dealt to no shard (first: catalogue:removal-early)",
    ),
    (
        "equivalents",
        in_shard(3, absent_reason),
        f"shards 1/3 and 3/3 disagree on the equivalents record {ABSENT}",
    ),
]


@pytest.mark.parametrize(
    ("spoil", "line"), [(spoil, line) for _, spoil, line in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_shards_that_do_not_make_one_run_are_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    spoil: Callable[[Shards], Shards],
    line: str,
) -> None:
    paths = save(tmp_path / "shards", spoil(three()))
    assert merge(tmp_path, paths) == ExitCode.USAGE
    shown = said(capsys)
    assert shown.startswith(f"fence-audit: {line}"), shown
    assert not (tmp_path / "reports" / "audit.json").exists()


def test_shards_of_other_runs_are_named_with_both_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = save(tmp_path, other_run(lambda run: run.update(vllm_version="0.32.0"))(three()))
    assert merge(tmp_path, paths) == 1
    shown = said(capsys)
    assert f"(shard 1/3: 0.33.0 ({paths[0]}); shard 2/3: 0.32.0 ({paths[1]})" in shown
    assert "; next: merge the audit.json of every shard of one run" in shown


def test_shards_dealt_by_other_durations_are_told_to_share_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert merge(tmp_path, save(tmp_path, other_durations(three()))) == 1
    shown = said(capsys)
    assert f"(shard 1/3: {COSTS} ({tmp_path / 'shard-1' / 'audit.json'});" in shown
    assert "; next: give every shard the same --shard-costs (a coverage-map.json)" in shown


def test_an_interrupted_shard_is_refused_with_13(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = three()
    shards[1]["mutants"].pop()
    shards[1]["incomplete"] = {"judged": 2, "of": 3}
    retally(shards[1])
    assert merge(tmp_path, save(tmp_path, shards)) == ExitCode.INCOMPLETE == 13
    shown = said(capsys)
    assert shown.startswith(
        "fence-audit: shard 2/3 is incomplete: it was interrupted after 2 of 3 mutants"
    )
    assert "run `fence-audit mutate --shard 2/3` again" in shown.partition("; next: ")[2]


def test_a_whole_run_is_not_a_shard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = save(tmp_path, [whole_run()])
    assert merge(tmp_path, paths) == 1
    assert said(capsys).startswith(
        "fence-audit: audit.json is the results of a whole run, not of a shard (no `shard` field)"
    )


def test_a_damaged_shard_is_named_by_the_reader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = three()
    shards[2]["regions"]["removal"]["killed"] = 5  # not what its mutants make
    paths = save(tmp_path, shards)
    assert merge(tmp_path, paths) == 1
    shown = said(capsys)
    assert shown.startswith(
        "fence-audit: the results file does not add up: regions.removal.killed: the file says "
        f"5, its mutants say 0 (file: {paths[2]})"
    )


def test_the_merged_file_never_replaces_a_shard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Shard 1's reports folder, as `mutate --shard 1/3` left it, named as merge's."""
    paths = save(tmp_path, three())
    manifest = {"format": MANIFEST_FORMAT, "written": ["audit.json"]}
    (paths[0].parent / MANIFEST).write_text(json.dumps(manifest))
    before = paths[0].read_text()
    assert merge(tmp_path, paths, reports=paths[0].parent) == 1
    assert said(capsys).startswith(
        "fence-audit: the merged audit.json would replace a shard's results"
    )
    assert paths[0].read_text() == before


def test_shards_of_other_scopes_are_refused(tmp_path: Path) -> None:
    """``scope`` is a field a later fence-audit may write: compared when there."""
    parts = [read_part(path) for path in save(tmp_path, three())]
    parts[2].document["scope"] = "functions"
    with pytest.raises(ConfigError, match="they differ in their scope"):
        merged_document(parts)
    for part in parts:
        part.document["scope"] = "regions"
    assert merged_document(parts)["scope"] == "regions"
    assert [m["id"] for m in merged_document(parts)["mutants"]] == run_ids()


def test_a_gate_naming_an_unknown_region_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = save(tmp_path, three())
    assert merge(tmp_path, paths, None, "--fail-under-region", "nosuch=50") == ExitCode.USAGE
    assert said(capsys).startswith(
        "fence-audit: the gate names region 'nosuch', which is neither configured nor in the "
        "results"
    )
    assert not (tmp_path / "reports").exists()

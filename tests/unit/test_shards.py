"""Shards: the partition of a run's mutants (``--shard K/N``), a shard's results read
back, and ``fence-audit merge`` putting hand-made shards back into the run they came
from. The same on the toy target, judged for real: tests/integration/test_toy_shards.py.
The refusals of merge are in tests/faults/test_shard_files.py."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from shard_documents import (
    ABSENT,
    THREE,
    retally,
    run_ids,
    save,
    split,
    whole_module,
    whole_run,
)

from audit.baseline.coverage_map import write_coverage_map
from audit.cli import main
from audit.core.errors import ConfigError, ExitCode
from audit.mutation.scope import OUTSIDE_REGIONS
from audit.results.report_model import load_results
from audit.results.shards import Shard, cost, costs_digest, partition, read_costs
from audit.setup import model
from audit.setup.model import Mutant

ROOT = Path(__file__).resolve().parents[2]


def mutant(identifier: str, *tests: str) -> Mutant:
    return Mutant(identifier, "mutmut", "flush", "F.f", "op", 0, 1, (1,), "", (), tests)


def loads(
    deal: tuple[tuple[str, ...], ...], mutants: list[Mutant], durations: dict[str, float]
) -> list[int]:
    by_id = {m.id: m for m in mutants}
    return [sum(cost(by_id[i], durations) for i in ids) for ids in deal]


def random_run(seed: int, count: int = 60) -> tuple[list[Mutant], dict[str, float]]:
    """``count`` mutants over 25 tests of random durations, some reached by no test."""
    chance = random.Random(seed)
    durations = {f"t{n}": round(chance.uniform(0.001, 2.0), 6) for n in range(25)}
    mutants = [
        mutant(f"F.f:op@{n}:0-{n}:1#0", *chance.sample(sorted(durations), chance.randrange(4)))
        for n in range(count)
    ]
    return mutants, durations


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7])
def test_every_mutant_is_dealt_to_exactly_one_shard_in_the_run_order(count: int) -> None:
    mutants, durations = random_run(count)
    deal = partition(mutants, durations, count)
    assert len(deal) == count
    dealt = [i for ids in deal for i in ids]
    assert sorted(dealt) == sorted(m.id for m in mutants)
    order = [m.id for m in mutants]
    for ids in deal:
        assert list(ids) == [i for i in order if i in ids]


@pytest.mark.parametrize("seed", range(5))
def test_shards_end_within_one_mutant_of_each_other(seed: int) -> None:
    """Greedy to the lightest shard: the last mutant put on the heaviest one went
    where the load was least, so no shard carries more than the lightest plus one
    mutant's cost."""
    mutants, durations = random_run(seed, 200)
    deal = partition(mutants, durations, 4)
    carried = loads(deal, mutants, durations)
    largest = max(cost(m, durations) for m in mutants)
    assert max(carried) - min(carried) <= largest
    # and far better than dealing in turn, which ignores the costs
    in_turn = tuple(tuple(m.id for m in mutants[k::4]) for k in range(4))
    assert max(carried) < max(loads(in_turn, mutants, durations))


def test_the_dearest_go_first_to_the_lightest_shard_and_ties_to_the_lower_index() -> None:
    durations = {"a": 5.0, "b": 4.0, "c": 3.0}
    mutants = [
        mutant("m5", "a"),
        mutant("m4", "b"),
        mutant("m3x", "c"),
        mutant("m3y", "c"),
        mutant("m3z", "c"),
    ]
    # 5 -> 1; 4 -> 2; 3 -> 2 (4 < 5); 3 -> 1 (5 < 7); 3 -> 2 (7 < 8)
    assert partition(mutants, durations, 2) == (("m5", "m3y"), ("m4", "m3x", "m3z"))


def test_mutants_no_test_reaches_are_dealt_too_spread_by_count() -> None:
    mutants = [mutant(f"m{n}") for n in range(5)]  # cost nothing: "no tests" at once
    assert partition(mutants, {}, 2) == (("m0", "m2", "m4"), ("m1", "m3"))
    assert partition(mutants[:1], {}, 3) == (("m0",), (), ())


def test_a_test_counts_once_for_a_mutant_and_a_test_without_a_duration_costs_nothing() -> None:
    durations = {"a": 0.25, "b": 0.5}
    assert cost(mutant("m", "a", "b", "a", "unknown"), durations) == 750_000


PARTITION = """
import dataclasses, json, random, sys
from audit.setup.model import Mutant
from audit.results.shards import partition
chance = random.Random(7)
durations = {f"t{n}": chance.uniform(0.0001, 3.0) for n in range(40)}
mutants = [
    Mutant(f"F.f:op@{n}:0#0", "mutmut", "r", "F.f", "op", 0, 1, (1,), "", (),
           tuple(chance.sample(sorted(durations), chance.randrange(8))))
    for n in range(120)
]
# as another process could hold them: another order, sets of tests, another dict order
if sys.argv[1] == "shuffled":
    chance.shuffle(mutants)
    mutants = [dataclasses.replace(m, covered_by=tuple(set(m.covered_by))) for m in mutants]
    durations = dict(sorted(durations.items(), reverse=True))
print(json.dumps([sorted(ids) for ids in partition(mutants, durations, 4)]))
"""


def test_every_process_deals_the_same_whatever_its_hash_seed_and_input_order() -> None:
    outputs = set()
    for seed, order in [("0", "plain"), ("1", "shuffled"), ("2", "shuffled"), ("3", "plain")]:
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        ran = subprocess.run(
            [sys.executable, "-c", PARTITION, order],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr
        outputs.add(ran.stdout)
    assert len(outputs) == 1
    assert all(json.loads(outputs.pop()))  # four shards, none empty


def test_the_costs_digest_names_the_durations_not_their_order() -> None:
    durations = {"a": 0.1, "b": 0.2}
    assert costs_digest(durations) == costs_digest({"b": 0.2, "a": 0.1})
    assert costs_digest(durations) != costs_digest({"a": 0.1, "b": 0.3})


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("0/4", "K must lie in 1..N"),
        ("5/4", "K must lie in 1..N"),
        ("1/0", "K must lie in 1..N"),
        ("2", "is not of the form K/N"),
        ("a/b", "is not of the form K/N"),
        ("2/4/8", "is not of the form K/N"),
    ],
)
def test_a_shard_that_is_not_k_of_n_is_refused(
    text: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match=problem):
        Shard.parse(text)
    assert main(["mutate", "--shard", text]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith("fence-audit: argument --shard: "), err
    assert problem in err


def test_a_shard_is_k_of_n() -> None:
    assert Shard.parse("2/4") == Shard(2, 4)
    assert str(Shard.parse("1/1")) == "1/1"


def test_shard_costs_are_read_from_a_coverage_map(tmp_path: Path) -> None:
    source = tmp_path / "fence.py"
    source.write_text("x = 1\n")
    target = model.Target("toypkg.fence", source, source, "0" * 64)
    path = tmp_path / "coverage-map.json"
    write_coverage_map(model.CoverageMap(target, "0.33.0", {1: ("t1",)}, {"t1": 0.5}), path)
    assert read_costs(path) == {"t1": 0.5}
    path.write_text(json.dumps({"format": 2, "tests": []}))
    with pytest.raises(ConfigError, match="not a coverage map: format: expected 1"):
        read_costs(path)
    path.write_text("{")
    with pytest.raises(ConfigError, match="cannot be read as JSON"):
        read_costs(path)


def test_shard_costs_without_a_shard_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.fence-audit]\n")
    code = main(["mutate", "--config", str(config), "--shard-costs", str(config)])
    assert code == ExitCode.USAGE
    assert capsys.readouterr().err.startswith(
        "fence-audit: --shard-costs deals the mutants over shards: it needs --shard K/N"
    )


def test_a_shard_reads_back_with_its_part_of_the_run(tmp_path: Path) -> None:
    paths = save(tmp_path, split(whole_run(), THREE))
    results = load_results(paths[1])
    assert results.shard is not None
    assert (str(results.shard), len(results.shard.run)) == ("2/3", 9)
    assert [m.id for m in results.mutants] == list(THREE[1])
    assert results.overall.judged == 2  # its own mutants' tallies: one killed, one survived
    assert [e.id for e in results.equivalents] == ["Fence.remove:swap_op@3:15-3:24#0", ABSENT]
    assert results.shard.described() == "shard 2 of 3: 3 of the run's 9 mutants"


def merge(tmp_path: Path, paths: list[Path], *args: str) -> int:
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.fence-audit]\n")  # the built-in configuration
    reports = ["--reports", str(tmp_path / "reports")]
    return main(["merge", "--config", str(config), *reports, *map(str, paths), *args])


@pytest.mark.parametrize(
    "deal",
    [
        (tuple(run_ids()),),
        THREE,
        (THREE[0] + THREE[2], THREE[1], (), ()),  # shards that were dealt nothing
    ],
    ids=["one", "three", "four-with-empty"],
)
def test_the_merge_of_the_shards_is_the_whole_run(
    tmp_path: Path, deal: tuple[tuple[str, ...], ...]
) -> None:
    run = whole_run()
    shards = split(run, deal)
    paths = save(tmp_path, reversed(shards))  # given in any order
    assert merge(tmp_path, paths) == ExitCode.OK
    merged = json.loads((tmp_path / "reports" / "audit.json").read_text())
    # the earliest start, and the longest shard's time: they ran side by side
    expected = {**run, "started_at": "2026-12-01T10:00:01+00:00", "duration_s": len(deal)}
    assert merged == expected
    assert list(merged["mutants"]) == run["mutants"]  # the run's order
    assert [e["id"] for e in merged["equivalents"]] == [e["id"] for e in run["equivalents"]]
    index = (tmp_path / "reports" / "index.html").read_text()
    assert 'id="shard"' not in index
    assert load_results(tmp_path / "reports" / "audit.json").shard is None


def test_the_merge_of_a_whole_module_s_shards_scores_the_group_apart(tmp_path: Path) -> None:
    run = whole_module()
    apart = [m for m in run["mutants"] if m["region"] == OUTSIDE_REGIONS]
    assert apart
    assert run["score"]["judged"] < sum(r["judged"] for r in run["regions"].values())
    paths = save(tmp_path, split(run, THREE))
    assert merge(tmp_path, paths) == ExitCode.OK
    merged = json.loads((tmp_path / "reports" / "audit.json").read_text())
    assert merged["score"] == run["score"]
    assert merged["regions"] == run["regions"]
    assert (
        load_results(tmp_path / "reports" / "audit.json").overall.judged == (run["score"]["judged"])
    )


def test_merge_ends_with_the_gate_as_mutate_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = save(tmp_path, split(whole_run(), THREE))
    code = merge(tmp_path, paths, "--fail-under-region", "population=100")
    out = capsys.readouterr().out
    assert code == ExitCode.SCORE_BELOW_THRESHOLD
    assert "fence-audit: merged 3 shards into" in out
    assert "gate: score of population: 66.67% (2 killed of 3 judged), required 100%: FAILED" in out
    assert merge(tmp_path, paths, "--fail-under-region", "population=60") == ExitCode.OK


def test_the_gate_refuses_one_shard_and_the_reports_say_what_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = save(tmp_path, split(whole_run(), THREE))[0]
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.fence-audit]\n")
    assert main(["gate", "--config", str(config), "--results", str(path)]) == 13
    assert capsys.readouterr().err.startswith(
        "fence-audit: the results are one shard of a run (shard 1 of 3: 3 of the run's 9 "
        "mutants); the gate cannot pass on a part of the run"
    )
    reports = tmp_path / "reports"
    args = ["report", "--config", str(config), "--reports", str(reports), "--results", str(path)]
    assert main(args) == ExitCode.OK
    banner = "One shard: shard 1 of 3: 3 of the run&#x27;s 9 mutants; the scores are of its"
    assert banner in (reports / "index.html").read_text()
    summary = (reports / "summary.md").read_text()
    assert "> **One shard**: shard 1 of 3: 3 of the run's 9 mutants;" in summary


def spoil_marker(change: Callable[[dict[str, Any]], object]) -> Callable[[dict[str, Any]], None]:
    return lambda document: change(document["shard"]) and None


def drop_last_mutant(document: dict[str, Any]) -> None:
    document["mutants"].pop()
    retally(document)


def list_only_absent(document: dict[str, Any]) -> None:
    document["shard"]["equivalents"].remove(ABSENT)


@pytest.mark.parametrize(
    ("spoil", "field", "problem"),
    [
        (spoil_marker(lambda s: s.update(index=4)), "shard.index", "4 is not in 1..3"),
        (spoil_marker(lambda s: s.update(index=0)), "shard.index", "0 is not in 1..3"),
        (
            spoil_marker(lambda s: s["run"].append(s["run"][0])),
            "shard.run[9]",
            "is also shard.run[0]",
        ),
        (
            spoil_marker(lambda s: s["mutants"].append("nowhere")),
            "shard.mutants[3]",
            "'nowhere' is not in the run",
        ),
        (
            spoil_marker(lambda s: s["mutants"].pop(0)),
            "mutants[0].id",
            "was not dealt to shard 1/3",
        ),
        (drop_last_mutant, "shard.mutants", "1 mutants dealt to this shard are not in the file"),
        (list_only_absent, "equivalents[0].id", f"{ABSENT!r} is not in shard.equivalents"),
        (
            spoil_marker(lambda s: s.update(costs="yes")),
            "shard.costs",
            "'yes' is not a sha256 digest",
        ),
        (spoil_marker(lambda s: s.update(jobs=4)), "shard.jobs", "unexpected field"),
        (spoil_marker(lambda s: s.pop("run")), "shard.run", "missing"),
    ],
)
def test_a_damaged_shard_field_is_refused_by_name(
    tmp_path: Path,
    spoil: Callable[[dict[str, Any]], None],
    field: str,
    problem: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    document = copy.deepcopy(split(whole_run(), THREE)[0])
    spoil(document)
    path = save(tmp_path, [document])[0]
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.fence-audit]\n")
    assert main(["gate", "--config", str(config), "--results", str(path)]) == 1
    line = capsys.readouterr().err.splitlines()[0]
    assert line.startswith(f"fence-audit: the results file is damaged: {field}: "), line
    assert problem in line

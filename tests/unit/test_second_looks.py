"""The random workloads alone (``mutate --random-alone``): the second judgements, and
their column, counted from the mutants on every read."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from audit.core.errors import ConfigError
from audit.core.protocol import MutantStatus
from audit.judging import alone, deep
from audit.rendering.html_report import render_index, render_region
from audit.rendering.markdown_report import render_summary
from audit.results.report_model import load_results
from audit.setup.config import SuitePath
from audit.setup.model import Mutant, MutantResult

DATA = Path(__file__).parent / "data" / "results.json"
STATEFUL = "project/tests/fence/test_fence_stateful.py::test_random_workloads"
WORKLOADS = alone.Workloads(
    (SuitePath("project", "tests/fence/test_fence_stateful.py::test_random_workloads"),)
)


def mutant(id_: str, region: str, covered_by: tuple[str, ...]) -> Mutant:
    return Mutant(id_, "mutmut", region, "f", "op", 0, 1, (1,), f"-x = {id_!r}", (), covered_by)


def test_a_workload_is_named_by_test_id_or_file() -> None:
    by_file = alone.Workloads((SuitePath("project", "tests/fence/test_fence_stateful.py"),))
    assert by_file.holds(STATEFUL)
    assert by_file.holds("project/tests/fence/test_fence_stateful.py::test_other[1]")
    assert not by_file.holds("project/tests/fence/test_fence_stateful_more.py::test_x")
    assert WORKLOADS.holds(STATEFUL)
    assert WORKLOADS.holds(STATEFUL + "[seed]")
    assert not WORKLOADS.holds(STATEFUL + "_too")
    assert not WORKLOADS.holds("tests/fence/test_fence_stateful.py::test_random_workloads")
    vllm = alone.Workloads((SuitePath("vllm", "tests/v1/test_a.py"),))
    assert vllm.holds("tests/v1/test_a.py::test_b")


def test_each_fence_mutant_is_judged_again_by_the_workloads_alone() -> None:
    targeted = "project/tests/fence/test_fence_scenarios.py::test_x"
    mutants = (
        mutant("a", "flush", (targeted, STATEFUL)),
        mutant("b", "removal", (targeted,)),
        mutant("c", "changed-outside-regions", (STATEFUL,)),  # apart: not the fence's
    )
    seconds = alone.second_judgements(mutants, WORKLOADS)
    assert [(m.id, m.covered_by) for m in seconds] == [("a~random", (STATEFUL,)), ("b~random", ())]
    # the same mutation, under its own id, with the workloads among its tests alone
    for second, first in zip(seconds, mutants[:2], strict=True):
        assert dataclasses.replace(second, id=first.id, covered_by=first.covered_by) == first
    verdicts = {
        "a": MutantResult("a", MutantStatus.KILLED, targeted),
        "a~random": MutantResult("a~random", MutantStatus.SURVIVED),
        "b": MutantResult("b", MutantStatus.KILLED, targeted),
        "b~random": MutantResult("b~random", MutantStatus.NO_TESTS),
    }
    own, second = alone.split(verdicts)
    assert set(own) == {"a", "b"}
    assert second["a"] == MutantResult("a", MutantStatus.SURVIVED)
    assert not alone.killed(own["a"].status, second["a"].status)
    assert alone.killed(MutantStatus.TIMEOUT, MutantStatus.KILLED)
    assert not alone.killed(MutantStatus.EQUIVALENT, MutantStatus.KILLED)  # outside the score


def measured(tmp_path: Path, seconds: dict[str, str]) -> Path:
    """The fixture's audit.json, measured by the random workloads: ``seconds`` gives
    each mutant's second status by id (every other mutant: survived)."""
    document: dict[str, Any] = json.loads(DATA.read_text())
    document["random_workloads"] = [str(w) for w in WORKLOADS.selectors]
    for body in document["mutants"]:
        status = seconds.get(body["id"], "survived")
        body["random"] = {"status": status, "killed_by": None, "failure": None, "duration_s": 1.5}
    path = tmp_path / "audit.json"
    path.write_text(json.dumps(document))
    return path


def test_the_column_counts_the_kills_of_the_workloads_alone(tmp_path: Path) -> None:
    path = measured(
        tmp_path,
        {
            "Fence.register:swap_op@3:15-3:24#0": "killed",
            "catalogue:population-deleted-registration": "killed",
            "Fence.remove:loop@2:8-2:30#0": "killed",  # a timeout of the suite's
            "Fence.remove:number@5:24-5:25#0": "killed",  # no tests: not in the score
            "Fence.register:number@5:28-5:29#0": "killed",  # equivalent: neither
        },
    )
    results = load_results(path)
    population, removal = results.region("population"), results.region("removal")
    assert (population.killed_by_random, population.tally.judged) == (2, 3)
    assert (removal.killed_by_random, removal.tally.judged) == (1, 3)
    assert results.killed_by_random == 3
    assert results.random_score == pytest.approx(50.0)
    summary = render_summary(results)
    assert "| random workloads alone |" in summary
    assert "| 66.7% (2) |" in summary  # population
    assert "| 50.0% (3) |" in summary  # all
    assert "1 of 2 catalogue entries" in summary
    assert "- `catalogue:removal-early`" in summary  # the entry they do not kill
    index = render_index(results)
    assert "random workloads alone</th>" in index
    assert 'id="random-alone"' in index
    page = render_region(results, removal)
    assert "<dt>random workloads alone</dt>" in page


def test_without_the_measure_there_is_no_column(tmp_path: Path) -> None:
    results = load_results(DATA)
    assert results.random_score is None
    assert results.region("population").killed_by_random is None
    assert "random workloads alone" not in render_summary(results)
    assert "random workloads alone" not in render_index(results)


def test_a_measured_file_missing_a_judgement_is_refused(tmp_path: Path) -> None:
    path = measured(tmp_path, {})
    document = json.loads(path.read_text())
    del document["mutants"][0]["random"]
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=r"damaged: mutants\[0\]\.random: missing"):
        load_results(path)


EXAMPLE = """Traceback (most recent call last):
AssertionError: assert False == (4 >= 4)
Failing test case: <state machine>
state = Stores()
state.store(block=1)
state.abort(data=data(...))
Draw 1: 'r1'
state.store(block=4)
state.teardown()
"""


def deep_measured(tmp_path: Path, statuses: dict[str, str]) -> Path:
    """The fixture's audit.json with a deep look: ``statuses`` by survivor id."""
    document: dict[str, Any] = json.loads(DATA.read_text())
    document["deep"] = {"profile": "deep", "seconds": 300.0}
    for body in document["mutants"]:
        if body["id"] in statuses:
            status = statuses[body["id"]]
            body["deep"] = {
                "status": status,
                "killed_by": STATEFUL if status == "killed" else None,
                "failure": EXAMPLE if status == "killed" else None,
                "duration_s": 42.0,
            }
    path = tmp_path / "audit.json"
    path.write_text(json.dumps(document))
    return path


SURVIVORS = ("Fence.register:swap_op@3:29-3:36#1", "catalogue:removal-early")


def test_a_deep_kill_is_shown_with_its_example_as_a_test_to_paste(tmp_path: Path) -> None:
    results = load_results(
        deep_measured(tmp_path, dict(zip(SURVIVORS, ("killed", "timeout"), strict=True)))
    )
    assert results.deep_look == ("deep", 300.0)
    assert results.overall.killed == load_results(DATA).overall.killed  # the score is the suite's
    summary = render_summary(results)
    assert "1 of 2 survivors killed by the deep hunt" in summary
    assert "**killed by the deep hunt**" in summary
    assert "Deep second look: nothing found within the time box." in summary
    test = deep.regression_test(EXAMPLE, SURVIVORS[0], STATEFUL, "0.33.0")
    assert test in summary
    assert test == (
        "def test_found_by_the_deep_look_fence_register_swap_op_3_29_3_36_1() -> None:\n"
        '    """The deep second look\'s example on mutant Fence.register:swap_op@3:29-3:36#1 '
        '(vLLM 0.33.0)."""\n'
        "    from test_fence_stateful import Stores\n\n"
        "    state = Stores()\n"
        "    state.store(block=1)\n"
        "    state.abort(data=data(...))\n"
        "    state.store(block=4)\n"
        "    state.teardown()\n"
    )
    page = render_region(results, results.region("population"))
    assert "<dt>deep second look</dt>" in page
    assert "killed by the deep hunt</strong>" in page


def test_a_deep_look_must_cover_every_survivor_and_nothing_else(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\.deep: missing"):
        load_results(deep_measured(tmp_path, {SURVIVORS[0]: "timeout"}))
    killed = {**dict.fromkeys(SURVIVORS, "timeout"), "Fence.register:swap_op@3:15-3:24#0": "killed"}
    with pytest.raises(ConfigError, match=r"only a survivor of the fence has one"):
        load_results(deep_measured(tmp_path, killed))
    document = json.loads(deep_measured(tmp_path, dict.fromkeys(SURVIVORS, "timeout")).read_text())
    del document["deep"]
    (tmp_path / "audit.json").write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=r"the run has no deep look"):
        load_results(tmp_path / "audit.json")


def test_the_profile_they_run_under_is_part_of_the_id_and_set_in_the_fork() -> None:
    dev = alone.Workloads(WORKLOADS.selectors, "dev")
    (second,) = alone.second_judgements((mutant("a", "flush", (STATEFUL,)),), dev)
    assert second.id == "a~random-dev"  # a verdict under another profile is not reused
    assert dev.environment() == {"HYPOTHESIS_PROFILE": "dev"}
    assert WORKLOADS.environment() == {}
    _, by_mutant = alone.split({second.id: MutantResult(second.id, MutantStatus.KILLED)})
    assert by_mutant["a"].id == "a"

"""A job runs first the tests named after what its mutant changes; a job of a chain
runs first the tests that killed the members before it; vLLM's tests stay before
this project's; the chain with the most work left starts first; the benchmark's replay
of mutmut's order runs the tests as given."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from audit.core.protocol import Chain, Job, Member, MutantStatus, Verdict
from audit.judging.jobs import ExecutorOptions, build_job, initial_order, words
from audit.judging.verdict_cache import TestHasher, VerdictCache
from audit.mutation.mutmut_adapter import run_orders
from audit.setup.model import Mutant
from audit.testproc.order import Schedule, guided

VLLM = tuple(f"tests/v1/t.py::t{i}" for i in range(4))
OURS = ("project/fence/test_f.py::a", "project/fence/test_f.py::b")


def test_killers_on_the_same_line_come_first_then_the_function_s_killers() -> None:
    kills = [((7,), VLLM[3]), ((9,), VLLM[2]), ((9,), VLLM[2])]

    assert guided(VLLM, (7,), kills) == (VLLM[3], VLLM[2], VLLM[0], VLLM[1])
    assert guided(VLLM, (9,), kills) == (VLLM[2], VLLM[3], VLLM[0], VLLM[1])


def test_no_kill_leaves_the_order_alone() -> None:
    assert guided(VLLM + OURS, (7,), []) == VLLM + OURS


def test_a_test_of_this_project_never_runs_before_vllm_s() -> None:
    # else a kill by this project's suite would no longer mean vLLM's tests missed it
    order = guided(VLLM + OURS, (7,), [((7,), OURS[1])])

    assert order == (*VLLM, OURS[1], OURS[0])


def mutant(diff: str, *tests: str) -> Mutant:
    return Mutant("F.f:op@1:0-1:1#0", "mutmut", "", "F.f", "op", 0, 1, (1,), diff, (), tests)


CHANGE = """--- a/scheduler.py
+++ b/scheduler.py
@@ -3 +3 @@
-            offload_prompt_only=spec.offload_prompt_only,
+            offload_prompt_only=None,
"""
FAST, SLOW = "tests/v1/t.py::test_store_jobs[True]", "tests/v1/t.py::test_offload_prompt_only[1]"
DURATIONS = {FAST: 0.01, SLOW: 0.5}


def test_a_test_named_after_the_changed_code_runs_before_faster_ones() -> None:
    assert initial_order(mutant(CHANGE, FAST, SLOW), DURATIONS) == (SLOW, FAST)


def test_a_word_every_covering_test_is_named_with_weighs_nothing() -> None:
    slow, fast = "tests/v1/t.py::test_offload_jobs", "tests/v1/t.py::test_offload_fast"

    assert initial_order(mutant(CHANGE, slow, fast), {slow: 0.3, fast: 0.01}) == (fast, slow)


def test_a_rare_word_weighs_more_than_two_common_ones() -> None:
    common = tuple(f"tests/v1/t.py::test_offload_only_{n}" for n in "abc")
    rare = "tests/v1/t.py::test_prompt_slow"
    durations = {**dict.fromkeys(common, 0.01), rare: 0.5}

    assert initial_order(mutant(CHANGE, *common, rare), durations)[0] == rare


def test_without_a_shared_word_the_fastest_runs_first() -> None:
    unrelated = CHANGE.replace("offload_prompt_only", "window")
    assert initial_order(mutant(unrelated, SLOW, FAST), DURATIONS) == (FAST, SLOW)


def test_a_named_test_of_this_project_still_runs_after_vllm_s() -> None:
    ours = "project/fence/test_f.py::test_offload_prompt_only"

    assert initial_order(mutant(CHANGE, ours, FAST), {ours: 0.0, FAST: 0.1}) == (FAST, ours)


def test_words_split_identifiers_and_leave_keywords_out() -> None:
    text = "if self._stale_job_threshold is None and getNumThreads(LOOKUP_SYNC_DELAY, x2):"

    assert words(text) == {
        *("stale", "job", "threshold", "get", "num", "threads", "lookup", "sync", "delay")
    }


def job(key: str, cost: float, lines: tuple[int, ...] = (1,)) -> Job:
    return Job(
        key=key,
        id=key,
        function="f",
        edits=(),
        tests=VLLM,
        budgets=dict.fromkeys(VLLM, 1.0),
        timeout_s=10.0,
        lines=lines,
        cost=cost,
    )


def chain(*jobs: Job) -> Chain:
    return Chain(tuple(Member(j.key, j.lines) for j in jobs))


def test_one_job_of_a_chain_at_a_time_the_longest_chain_first() -> None:
    short, long1, long2 = job("s", 1.0), job("l1", 2.0), job("l2", 2.0)
    verdicts = {"l1": Verdict(MutantStatus.KILLED, VLLM[2], "", VLLM[:3])}
    schedule = Schedule([short, long1, long2], [chain(long1, long2)], verdicts.get)

    assert schedule.take() == long1  # 4 s of work left in its chain, 1 s in the other
    assert schedule.take() == short
    assert schedule.take() is None  # l2 waits for l1's verdict
    schedule.settled("l1")
    taken = schedule.take()
    assert taken is not None
    assert taken.tests == (VLLM[2], VLLM[0], VLLM[1], VLLM[3])
    assert not schedule


def test_a_member_without_a_verdict_guides_nothing() -> None:
    first, second = job("a", 1.0), job("b", 1.0)
    schedule = Schedule([first, second], [chain(first, second)], {}.get)

    assert schedule.take() == first
    schedule.settled("a")  # its judging ended without a verdict
    assert schedule.take() == second


def test_a_mutant_in_two_places_of_the_chains_is_refused() -> None:
    first = job("a", 1.0)
    with pytest.raises(ValueError, match="more than one place of the chains"):
        Schedule([first], [chain(first), chain(first)], {}.get)


def test_a_given_order_is_kept_and_its_verdict_kept_apart(tmp_path: Path) -> None:
    """The benchmark's replay of another engine's order: the job runs the covering
    tests as given, not named or fastest first, and its verdict has a key of its own,
    so a run in the usual order never reads it."""
    given = mutant(CHANGE, FAST, SLOW)  # the usual order runs SLOW first (its name)
    usual = build_job(given, "k", "", DURATIONS, ExecutorOptions())
    kept = build_job(given, "k", "", DURATIONS, ExecutorOptions(keep_order=True))
    assert usual.tests == (SLOW, FAST)
    assert kept.tests == (FAST, SLOW)
    cache = VerdictCache(tmp_path, TestHasher(tmp_path, ()), "0.33.0")
    keys = {cache.key(given, "h", {}), cache.key(given, "h", {}, given_order=True)}
    reordered = dataclasses.replace(given, covered_by=(SLOW, FAST))
    keys.add(cache.key(reordered, "h", {}, given_order=True))
    assert len(keys) == 3
    assert cache.key(given, "h", {}) == cache.key(reordered, "h", {})  # the usual key: a set


def test_mutmut_s_order_is_its_stats_fastest_first(tmp_path: Path) -> None:
    """As mutmut's run orders a mutant's tests: those its stats saw calling the
    function, by the durations it measured; ties by name; tests the baseline does not
    have left out, and a mutant whose function no test called has no order."""
    stats = {
        "tests_by_mangled_function_name": {
            "pkg.mod.xǁFǁf": [VLLM[0], VLLM[1], VLLM[2], "tests/gone.py::t"],
        },
        "duration_by_test": {VLLM[0]: 0.3, VLLM[1]: 0.1, VLLM[2]: 0.1, "tests/gone.py::t": 0.0},
    }
    (tmp_path / "mutants").mkdir()
    (tmp_path / "mutants" / "mutmut-stats.json").write_text(json.dumps(stats))
    other = dataclasses.replace(mutant(CHANGE, VLLM[0]), id="F.g:op@1:0-1:1#0", function="F.g")
    orders = run_orders(tmp_path, "pkg.mod", [mutant(CHANGE, VLLM[0]), other], set(VLLM))
    assert orders == {"F.f:op@1:0-1:1#0": (VLLM[1], VLLM[2], VLLM[0])}
    # a mutmut run that failed before its stats: no order, for any mutant
    (tmp_path / "mutants" / "mutmut-stats.json").write_text("{")
    assert run_orders(tmp_path, "pkg.mod", [mutant(CHANGE, VLLM[0])], set(VLLM)) == {}
    assert run_orders(tmp_path / "absent", "pkg.mod", [mutant(CHANGE, VLLM[0])], set(VLLM)) == {}

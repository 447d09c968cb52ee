"""A job of a chain runs first the tests that killed the members before it; vLLM's
tests stay before this project's; the chain with the most work left starts first."""

from __future__ import annotations

from audit.protocol import Chain, Job, Member, MutantStatus, Verdict
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
    try:
        Schedule([first], [chain(first), chain(first)], {}.get)
    except ValueError:
        return
    raise AssertionError("accepted a mutant in two chains")

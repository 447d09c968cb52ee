"""The mutation engine end to end on the toy target: warm executor, forks, cache."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kernel import kernel_collapses

from audit.baseline import coverage_map
from audit.baseline import run as baseline
from audit.baseline.run import start_baseline
from audit.core.environment import sha256_file
from audit.core.errors import ExitCode, ForcedFailCheckFailed
from audit.core.protocol import MutantStatus, Warmed, apply_edits, parse_event
from audit.judging import alone, deep, executor
from audit.judging.jobs import ExecutorOptions
from audit.mutation.mutants import build_mutants
from audit.setup.config import Config, DeepLook, SuitePath, load_config
from audit.setup.model import Target
from audit.setup.region_specs import RegionSpec, Selection, StatementSelector
from audit.setup.regions import resolve_regions
from audit.setup.sources import TestSource
from audit.setup.suite import stage_suite

TOY = Path(__file__).parent / "toy"
REGIONS = (
    RegionSpec("population", "", (Selection("Fence.register"),)),
    RegionSpec("removal", "", (Selection("Fence.remove", (StatementSelector("del self"),)),)),
    RegionSpec("flush", "", (Selection("Fence.flush"),)),
    RegionSpec("drain", "", (Selection("Fence.drain"),)),
    RegionSpec("handoff", "", (Selection("Fence.handoff"),)),
    RegionSpec("busy", "", (Selection("Fence.busy"),)),
    RegionSpec("evict", "", (Selection("Fence.evict"),)),
)
FAST = ExecutorOptions(jobs=2, timeout_min_s=1.0, timeout_factor=10.0)


class Toy:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = tmp_path / "toy"
        shutil.copytree(TOY, self.root)
        # the toy first; then what the caller had (a checkout of fence-audit itself)
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(self.root), *inherited]))
        self.path = self.root / "toypkg" / "fence.py"
        self.config: Config = dataclasses.replace(
            load_config(),
            target="toypkg.fence",
            reports_dir=tmp_path / "reports",
            cache_dir=tmp_path / "cache",
            project_dir=tmp_path,
            offline_models=(),
        )

    def judge(self, tests: str = "tests/test_fence.py", options=FAST, warm=False, workers=1):  # type: ignore[no-untyped-def]
        target = Target("toypkg.fence", self.path, self.path, sha256_file(self.path))
        source = TestSource(root=self.root, origin="toy")
        work = self.config.reports_dir / ".work"
        suite = stage_suite(self.config, source, (SuitePath("vllm", tests),), work)
        run, session = start_baseline(self.config, suite, target, work, workers=workers)
        if not warm and session is not None:
            session.close()
            session = None
        cmap = coverage_map.build_coverage_map(run, "toy")
        text = self.path.read_text()
        regions = resolve_regions(text, REGIONS, filename=str(self.path))
        mutant_set = build_mutants(text, str(self.path), regions, cmap.lines)
        self.durations, self.suite, self.target = cmap.durations, suite, target
        verdicts = self.judge_mutants(
            mutant_set.mutants, mutant_set.function_hashes, options, session
        )
        return mutant_set, verdicts

    def judge_mutants(self, mutants, hashes, options=FAST, session=None, **extra):  # type: ignore[no-untyped-def]
        """Judge ``mutants`` in a new executor, with the last ``judge``'s baseline."""
        return executor.judge(
            self.config,
            self.suite,
            self.target,
            mutants,
            hashes,
            self.durations,
            "toy",
            options,
            session,
            **extra,
        )


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Toy:
    return Toy(tmp_path, monkeypatch)


def statuses(mutant_set, verdicts, function: str) -> set[MutantStatus]:  # type: ignore[no-untyped-def]
    return {verdicts[m.id].status for m in mutant_set.mutants if m.function == function}


def test_each_mutant_gets_the_verdict_its_tests_deserve(toy: Toy) -> None:
    mutant_set, verdicts = toy.judge()
    # register is tested closely: every mutant is killed, and the killer is named.
    register = [m for m in mutant_set.mutants if m.function == "Fence.register"]
    assert register
    for mutant in register:
        verdict = verdicts[mutant.id]
        assert verdict.status is MutantStatus.KILLED, mutant.diff
        assert verdict.killed_by.startswith("tests/test_fence.py::")
        assert verdict.failure
    # flush has no test at all.
    assert statuses(mutant_set, verdicts, "Fence.flush") == {MutantStatus.NO_TESTS}
    # `steps += 1` -> `steps = 1` loops for ever: a timeout, and the run goes on.
    hang = next(m for m in mutant_set.mutants if m.operator == "augmented_assignment")
    assert "+            steps = 1" in hang.diff
    assert verdicts[hang.id].status is MutantStatus.TIMEOUT
    assert "hung" in verdicts[hang.id].failure
    assert verdicts[hang.id].hung[0].startswith("tests/test_fence.py::test_drain_counts_steps ")
    # `steps = 0` -> `steps = 1` still counts to 3: the test is too weak to notice.
    weak = next(m for m in mutant_set.mutants if "+        steps = 1" in m.diff)
    assert verdicts[weak.id].status is MutantStatus.SURVIVED


def evict_verdicts(toy: Toy, tests: str) -> dict[str, MutantStatus]:
    """The statuses of ``Fence.evict``'s mutants, by the line each one adds."""
    mutant_set, verdicts = toy.judge(tests=tests)
    statuses = {}
    for mutant in mutant_set.mutants:
        if mutant.function == "Fence.evict":
            added = next(line for line in mutant.diff.splitlines() if line.startswith("+ "))
            statuses[added.strip("+ ")] = verdicts[mutant.id].status
    return statuses


def test_a_log_call_that_cannot_be_formatted_fails_the_test(toy: Toy) -> None:
    # pytest's log handler raises on such a call where logging's own only prints. The
    # forks attach it once per test rather than per phase (testproc/logs.py), and
    # must keep that: the test below never looks at the log.
    statuses = evict_verdicts(toy, "tests/test_evict.py")
    dropped = 'logger.warning("block %d evicted with %d jobs pending", len(jobs))'
    assert statuses[dropped] is MutantStatus.KILLED
    reworded = 'logger.warning("XXblock %d evicted with %d jobs pendingXX", block, len(jobs))'
    assert statuses[reworded] is MutantStatus.SURVIVED


def test_a_test_that_reads_the_log_with_caplog_still_can(toy: Toy) -> None:
    statuses = evict_verdicts(toy, "tests/test_evict_warning.py")
    reworded = 'logger.warning("XXblock %d evicted with %d jobs pendingXX", block, len(jobs))'
    assert statuses[reworded] is MutantStatus.KILLED


def test_judging_in_the_warm_baseline_process_gives_the_same_verdicts(toy: Toy) -> None:
    _, cold = toy.judge(options=dataclasses.replace(FAST, use_cache=False))
    _, warm = toy.judge(options=dataclasses.replace(FAST, use_cache=False), warm=True)
    assert {k: v.status for k, v in warm.items()} == {k: v.status for k, v in cold.items()}
    assert not any(v.cached for v in warm.values())
    log = (toy.config.reports_dir / "logs" / "mutants.log").read_text()
    (warmed,) = [e for e in map(parse_event, log.splitlines()) if isinstance(e, Warmed)]
    assert warmed.tests == 0  # no second warm-up: the baseline was it


def warmed_event(toy: Toy) -> Warmed:
    log = (toy.config.reports_dir / "logs" / "mutants.log").read_text()
    (warmed,) = [e for e in map(parse_event, log.splitlines()) if isinstance(e, Warmed)]
    return warmed


@pytest.mark.skipif(not kernel_collapses(), reason="MADV_COLLAPSE needs Linux 6.1 and THP")
def test_the_baseline_s_process_moves_to_huge_pages_even_for_a_few_mutants(toy: Toy) -> None:
    """Idle while the audit builds the jobs, the baseline's process moves to huge pages
    whatever their number; a new executor process does it only for many mutants."""
    options = dataclasses.replace(FAST, use_cache=False)
    toy.judge(options=options)
    assert warmed_event(toy).huge_mb == 0  # the toy's few mutants: not worth a second
    toy.judge(options=options, warm=True)
    assert warmed_event(toy).huge_mb > 0


def test_the_baseline_s_process_warms_what_only_its_forks_ran(toy: Toy) -> None:
    """With two baseline workers the process the mutants fork from ran only half of
    the tests: it runs one of each test function only the other worker ran, says so,
    and the verdicts are the ones a new executor reaches."""
    options = dataclasses.replace(FAST, use_cache=False)
    _, cold = toy.judge(options=options)
    _, warm = toy.judge(options=options, warm=True, workers=2)
    assert {k: v.status for k, v in warm.items()} == {k: v.status for k, v in cold.items()}
    log = (toy.config.reports_dir / "logs" / "mutants.log").read_text()
    (warmed,) = [e for e in map(parse_event, log.splitlines()) if isinstance(e, Warmed)]
    # the toy's 4 tests of test_fence.py, dealt in turn: 2 functions only the fork ran
    assert (warmed.tests, warmed.red) == (2, ())


def test_work_given_to_the_baseline_runs_while_its_test_process_runs(
    toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mutate` generates its mutants while the baseline's test process starts: the
    work is done before the baseline is; if it fails, the test process is ended."""
    work = toy.config.reports_dir / ".work"
    target = Target("toypkg.fence", toy.path, toy.path, sha256_file(toy.path))
    suite = stage_suite(
        toy.config,
        TestSource(root=toy.root, origin="toy"),
        (SuitePath("vllm", "tests/test_fence.py"),),
        work,
    )
    sessions: list[baseline.WarmSession] = []

    class Recorded(baseline.WarmSession):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            sessions.append(self)

    monkeypatch.setattr(baseline, "WarmSession", Recorded)
    seen: list[bool] = []

    def meanwhile() -> None:
        (session,) = sessions
        seen.append(session.process.poll() is None and not (work / "baseline.coverage").exists())

    run, session = start_baseline(toy.config, suite, target, work, meanwhile=meanwhile)
    assert session is not None
    session.close()
    assert seen == [True]  # called once, before the baseline had written its coverage
    assert run.exit_code == 0
    assert run.tests

    def failing() -> None:
        raise RuntimeError("generation failed")

    sessions.clear()
    with pytest.raises(RuntimeError, match="generation failed"):
        start_baseline(toy.config, suite, target, work, meanwhile=failing)
    (session,) = sessions
    assert session.process.poll() is not None  # ended and collected, not left running


def test_the_audited_file_is_never_written(toy: Toy) -> None:
    before = toy.path.read_bytes()
    toy.judge()
    assert toy.path.read_bytes() == before


def test_second_run_takes_every_verdict_from_the_cache(toy: Toy) -> None:
    _, first = toy.judge()
    _, second = toy.judge()
    judged = [v for v in second.values() if v.status is not MutantStatus.NO_TESTS]
    assert any(v.status is MutantStatus.TIMEOUT for v in judged)  # the toy's endless loop
    # a timeout too: it was judged on the CPU the test used, not on the machine's load
    assert all(v.cached for v in judged)
    assert {k: v.status for k, v in first.items()} == {k: v.status for k, v in second.items()}


def test_a_blocked_test_is_stopped_long_before_its_budget(toy: Toy) -> None:
    """`turn >= 0` -> `turn > 0`: the first turn keeps the lock, the next one waits
    for ever without using the CPU. It is judged hung after a fifth of its budget."""
    options = dataclasses.replace(FAST, timeout_min_s=20.0, max_hangs=1)
    mutant_set, verdicts = toy.judge("tests/test_handoff.py", options=options)
    (blocked,) = (m for m in mutant_set.mutants if "+            if turn > 0:" in m.diff)
    verdict = verdicts[blocked.id]
    assert verdict.status is MutantStatus.TIMEOUT
    assert "blocked" in verdict.failure
    assert "no CPU" in verdict.failure
    assert verdict.duration_s < 10.0  # the window is 4 s of the 20 s budget


def test_a_changed_test_file_rejudges_the_mutants_it_covers(toy: Toy) -> None:
    toy.judge()
    test_file = toy.root / "tests" / "test_fence.py"
    test_file.write_text(test_file.read_text() + "\n# an edit\n")
    _, verdicts = toy.judge()
    judged = [v for v in verdicts.values() if v.status is not MutantStatus.NO_TESTS]
    assert judged
    assert not any(v.cached for v in judged)


def test_a_changed_function_rejudges_only_its_own_mutants(toy: Toy) -> None:
    toy.judge()
    text = toy.path.read_text()
    toy.path.write_text(text.replace("        steps = 0\n", "        steps = 0  # edited\n"))
    mutant_set, verdicts = toy.judge()
    for mutant in mutant_set.mutants:
        verdict = verdicts[mutant.id]
        if verdict.status is MutantStatus.NO_TESTS:
            continue
        assert verdict.cached is (mutant.function != "Fence.drain"), mutant.id


def test_a_cache_entry_is_one_complete_file_per_verdict(toy: Toy) -> None:
    toy.judge()
    results = toy.config.cache_dir / "results"
    files = list(results.iterdir())
    assert files
    assert all(f.suffix == ".json" and not f.name.startswith(".") for f in files)
    for file in files:
        assert json.loads(file.read_text())["status"] in {"killed", "survived", "timeout"}


def test_mutants_that_do_not_switch_on_stop_the_run(toy: Toy) -> None:
    """The forced-fail check: a test that swallows every error cannot kill anything."""
    with pytest.raises(ForcedFailCheckFailed) as info:
        toy.judge(tests="tests/test_swallow.py")
    assert info.value.exit_code == ExitCode.FORCED_FAIL_CHECK


def test_second_judgements_by_some_tests_alone_are_jobs_like_any(toy: Toy) -> None:
    """``--random-alone``'s mechanism on the toy: each mutant judged again with one weak
    test alone; the mutant's own verdict does not change, the second is cached too."""
    mutant_set, own = toy.judge()
    workloads = alone.Workloads((SuitePath("vllm", "tests/test_fence.py::test_register_only"),))
    seconds = alone.second_judgements(mutant_set.mutants, workloads)
    register = [m for m in seconds if m.function == "Fence.register"]
    assert register
    weak = ("tests/test_fence.py::test_register_only",)
    assert {m.covered_by for m in register} == {weak, ()}  # `continue`: the weak test skips it
    for run in range(2):
        verdicts = toy.judge_mutants((*mutant_set.mutants, *seconds), mutant_set.function_hashes)
        mine, second = alone.split(verdicts)
        assert {k: v.status for k, v in mine.items()} == {k: v.status for k, v in own.items()}
        # the weak test kills nothing its assertions do not look at
        assert MutantStatus.SURVIVED in {
            second[m.id].status for m in mutant_set.mutants if m.function == "Fence.register"
        }
        assert all(
            second[m.id].status is MutantStatus.NO_TESTS
            for m in mutant_set.mutants
            if m.function == "Fence.remove"
        )
        assert all(v.cached for v in second.values() if v.status is not MutantStatus.NO_TESTS) == (
            run == 1
        )


def test_the_deep_look_kills_a_survivor_only_the_longer_search_finds(toy: Toy) -> None:
    """`>= limit` -> `> limit` differs only with four blocks fenced at once, which the
    machine's `ci` programs (3 steps) never reach: a survivor. The deep look, under
    the `deep` profile (20 steps), finds it; its example, pasted as a test, passes on
    the code and fails on the mutant."""
    mutant_set, own = toy.judge("tests/test_machine.py")
    (rare,) = (
        m for m in mutant_set.mutants if "+        return len(self.pending) > limit" in m.diff
    )
    assert own[rare.id].status is MutantStatus.SURVIVED
    look = DeepLook(profile="deep", seconds=60)
    workloads = alone.Workloads((SuitePath("vllm", "tests/test_machine.py"),))
    looked = deep.second_looks(mutant_set.mutants, own, workloads, look)
    assert rare.id + deep.MARK + "-deep-60s" in {m.id for m in looked}
    assert all(own[m.id.split(deep.MARK)[0]].status is MutantStatus.SURVIVED for m in looked)
    verdicts = toy.judge_mutants(
        looked,
        mutant_set.function_hashes,
        deep.options(look, FAST),
        env=dict.fromkeys((m.id for m in looked), deep.environment(look)),
        whole_failure=True,
    )
    found = deep.by_mutant(verdicts, looked, look)[rare.id]
    assert found.status is MutantStatus.KILLED
    assert found.killed_by == "tests/test_machine.py::test_random_stores"
    test = deep.regression_test(found.failure, rare.id, found.killed_by, "toy")
    assert test.startswith("def test_found_by_the_deep_look_fence_busy")
    assert "    from test_machine import Stores\n" in test
    assert "    state = Stores()\n" in test
    assert test.count("state.store(block=") >= 4
    # pasted beside the machine, it passes on the toy and fails on the mutant
    pasted = toy.root / "tests" / "test_pasted.py"
    pasted.write_text(test)
    env = {**os.environ, "PYTHONPATH": f"{toy.root}{os.pathsep}{toy.root / 'tests'}"}

    def run() -> int:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(pasted)]
        done = subprocess.run(command, check=False, cwd=toy.root, env=env, capture_output=True)
        return done.returncode

    assert run() == 0
    toy.path.write_text(apply_edits(toy.path.read_text(), rare.edits))
    assert run() == 1


def test_a_changed_test_environment_rejudges_every_mutant(
    toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verdict holds for the environment its tests ran in: the variables a test can
    read (a Hypothesis profile, a seed) are part of its key, as of the baseline's."""
    toy.judge()
    monkeypatch.setenv("FENCE_TOY_KNOB", "1")
    _, changed = toy.judge()
    _, again = toy.judge()
    judged = [m for m, v in changed.items() if v.status is not MutantStatus.NO_TESTS]
    assert judged
    assert not any(changed[m].cached for m in judged)
    assert all(again[m].cached for m in judged)
    monkeypatch.setenv("PATH", os.environ["PATH"] + os.pathsep + "/nonexistent")
    _, unrelated = toy.judge()
    assert all(unrelated[m].cached for m in judged)


HANDOFF_ORDER = """\
import threading

from toypkg.fence import Fence


def test_two_turns():
    assert Fence().handoff(2) == 2


def test_the_turns_end_within_a_second():
    turns = threading.Thread(target=Fence().handoff, args=(2,), daemon=True)
    turns.start()
    turns.join(1.0)
    assert not turns.is_alive()
"""


def test_a_given_order_decides_between_a_hang_and_a_failure(toy: Toy) -> None:
    """The bench's replay of mutmut's order (bench.ours_in_order): the tests run as
    given and the first that hangs or fails decides. `turn >= 0` -> `turn > 0` keeps
    the lock: one test waits on it for ever, the other gives up after a second and
    fails. Hang first: timeout; failure first: killed."""
    (toy.root / "tests" / "test_handoff_order.py").write_text(HANDOFF_ORDER)
    mutant_set, _ = toy.judge("tests/test_handoff_order.py")
    (kept,) = (m for m in mutant_set.mutants if "+            if turn > 0:" in m.diff)
    hang = "tests/test_handoff_order.py::test_two_turns"
    fail = "tests/test_handoff_order.py::test_the_turns_end_within_a_second"
    assert set(kept.covered_by) == {hang, fail}
    replay = dataclasses.replace(FAST, keep_order=True, max_hangs=1, use_cache=False)
    orders = {"hang first": (hang, fail), "failure first": (fail, hang)}
    verdicts = {
        name: toy.judge_mutants(
            [dataclasses.replace(kept, covered_by=order)], mutant_set.function_hashes, replay
        )[kept.id]
        for name, order in orders.items()
    }
    assert verdicts["hang first"].status is MutantStatus.TIMEOUT
    assert verdicts["hang first"].hung[0].startswith(f"{hang} blocked")
    assert verdicts["hang first"].tests_run == (hang,)
    assert verdicts["failure first"].status is MutantStatus.KILLED
    assert verdicts["failure first"].killed_by == fail
    assert verdicts["failure first"].tests_run == (fail,)

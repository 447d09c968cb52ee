"""The baseline cache on the toy target: read back only when every input is unchanged,
and then the same coverage, the same covering tests, the same verdicts."""

from __future__ import annotations

import json
import re
from pathlib import Path

from test_toy_mutation import FAST, REGIONS, Toy, toy  # noqa: F401  (the fixture)

from audit.baseline import coverage_map
from audit.baseline.cache import BaselineCache, baseline_inputs
from audit.baseline.run import cached_baseline, start_baseline
from audit.core.environment import sha256_file
from audit.judging import executor
from audit.mutation.mutants import build_mutants
from audit.setup.config import SuitePath
from audit.setup.model import Target
from audit.setup.regions import resolve_regions
from audit.setup.sources import TestSource
from audit.setup.suite import Suite, stage_suite


def staged(toy: Toy) -> tuple[Suite, Target]:  # noqa: F811
    # As from a checkout: the toy's tests are then hashed file by file.
    source = TestSource(root=toy.root, origin="toy", checkout=True)
    work = toy.config.reports_dir / ".work"
    suite = stage_suite(toy.config, source, (SuitePath("vllm", "tests/test_fence.py"),), work)
    target = Target("toypkg.fence", toy.path, toy.path, sha256_file(toy.path))
    return suite, target


def inputs_of(toy: Toy, environ: dict[str, str] | None = None) -> dict[str, str]:  # noqa: F811
    suite, target = staged(toy)
    return baseline_inputs(suite, target.path, target.sha256, "toy", None, environ or {})


def test_a_kept_baseline_reads_back_to_the_same_coverage_and_verdicts(toy: Toy) -> None:  # noqa: F811
    suite, target = staged(toy)
    work = toy.config.reports_dir / ".work"
    run, session = start_baseline(toy.config, suite, target, work)
    assert session is not None
    session.close()
    cache = BaselineCache(toy.config.cache_dir / "baselines")
    inputs = baseline_inputs(suite, target.path, target.sha256, "toy", None, {})
    assert cache.load(inputs) is None
    cache.save(inputs, run, run.exit_code)
    ran = coverage_map.build_coverage_map(run, "toy")
    ran_lines, ran_durations = dict(ran.lines), dict(ran.durations)

    kept = cache.load(inputs)
    assert kept is not None
    (work / "baseline.coverage").unlink()  # the run's data is gone: the cache's is used
    again = cached_baseline(kept, toy.config, target, work)
    assert "read from the baseline cache" in again.log.read_text()
    read = coverage_map.build_coverage_map(again, "toy")
    assert (read.lines, read.durations) == (ran_lines, ran_durations)

    text = toy.path.read_text()
    regions = resolve_regions(text, REGIONS, filename=str(toy.path))
    mutant_set = build_mutants(text, str(toy.path), regions, read.lines)
    verdicts = executor.judge(
        toy.config,
        suite,
        target,
        mutant_set.mutants,
        mutant_set.function_hashes,
        read.durations,
        "toy",
        FAST,
        None,  # no warm process: a new one judges
    )
    assert any(v.status.value == "killed" for v in verdicts.values())
    _, direct = toy.judge()
    assert {k: v.status for k, v in verdicts.items()} == {
        k: v.status for k, v in direct.items() if k in verdicts
    }


def test_each_input_changes_the_key_and_a_rerun_says_which(toy: Toy) -> None:  # noqa: F811
    cache = BaselineCache(toy.config.cache_dir / "baselines")
    suite, target = staged(toy)
    work = toy.config.reports_dir / ".work"
    run, session = start_baseline(toy.config, suite, target, work)
    if session is not None:
        session.close()
    first = baseline_inputs(suite, target.path, target.sha256, "toy", None, {})
    cache.save(first, run, run.exit_code)
    assert cache.changed_since_last(first) == []

    profile = inputs_of(toy, {"HYPOTHESIS_PROFILE": "long", "HOME": "/elsewhere"})
    assert cache.load(profile) is None
    assert cache.changed_since_last(profile) == ["environment HYPOTHESIS_PROFILE is new"]
    ignored = {"HOME": "/elsewhere", "FENCE_AUDIT_CACHE": "/x", "PYTEST_CURRENT_TEST": "t"}
    assert inputs_of(toy, ignored) == first

    test_file = toy.root / "tests" / "test_fence.py"
    test_file.write_text(test_file.read_text() + "\n# an edit\n")
    edited = inputs_of(toy)
    assert cache.load(edited) is None
    assert cache.changed_since_last(edited) == ["file tests/test_fence.py changed"]

    toy.path.write_text(toy.path.read_text() + "\n# an edit\n")
    why = cache.changed_since_last(inputs_of(toy))
    assert why[0].startswith("audited source changed (sha256 "), why
    assert cache.load(first) is not None  # the old entry is still there, whole


def test_a_damaged_entry_is_not_read(toy: Toy) -> None:  # noqa: F811
    suite, target = staged(toy)
    work = toy.config.reports_dir / ".work"
    run, session = start_baseline(toy.config, suite, target, work)
    if session is not None:
        session.close()
    cache = BaselineCache(toy.config.cache_dir / "baselines")
    inputs = baseline_inputs(suite, target.path, target.sha256, "toy", None, {})
    cache.save(inputs, run, run.exit_code)
    entry = next(p for p in cache.directory.iterdir() if p.is_dir())
    outcomes = entry / "outcomes.json"
    document = json.loads(outcomes.read_text())
    outcomes.write_text(json.dumps({**document, "tests": [{"test_id": 3}]}))
    assert cache.load(inputs) is None
    outcomes.write_text(json.dumps(document))
    assert cache.load(inputs) is not None
    (entry / "baseline.coverage").unlink()
    assert cache.load(inputs) is None


def staged_dir(toy: Toy) -> tuple[Suite, Target]:  # noqa: F811
    """The toy's whole tests/ folder, as from a checkout (its files hashed one by one)."""
    source = TestSource(root=toy.root, origin="toy", checkout=True)
    work = toy.config.reports_dir / ".work"
    (toy.root / "tests" / "test_red.py").unlink(missing_ok=True)
    (toy.root / "tests" / "test_empty.py").unlink(missing_ok=True)
    suite = stage_suite(toy.config, source, (SuitePath("vllm", "tests"),), work)
    target = Target("toypkg.fence", toy.path, toy.path, sha256_file(toy.path))
    return suite, target


def _arcs(run) -> dict[str, set[tuple[int, int]]]:  # type: ignore[no-untyped-def]
    import coverage

    data = coverage.CoverageData(basename=str(run.data_file))
    data.read()
    arcs: dict[str, set[tuple[int, int]]] = {}
    for context in data.measured_contexts():
        data.set_query_contexts([f"^{re.escape(context)}$"])
        for file in data.measured_files():
            arcs.setdefault(context, set()).update(data.arcs(file) or ())
    return {c: a for c, a in arcs.items() if c}  # the import-time context aside


def test_when_only_test_files_changed_only_they_run_again(toy: Toy) -> None:  # noqa: F811
    suite, target = staged_dir(toy)
    work = toy.config.reports_dir / ".work"
    cache = BaselineCache(toy.config.cache_dir / "baselines")
    first, _ = start_baseline(toy.config, suite, target, work)
    cache.save(baseline_inputs(suite, target.path, target.sha256, "toy", None, {}), first, 0)
    handoff = toy.root / "tests" / "test_handoff.py"
    handoff.write_text(
        handoff.read_text() + "\ndef test_handoff_twice():\n    assert Fence().handoff(2) == 2\n"
    )
    (toy.root / "tests" / "test_more.py").write_text(
        "from toypkg.fence import Fence\n\n"
        "def test_register_once():\n    f = Fence()\n    f.register(1, [4])\n"
    )
    suite, target = staged_dir(toy)
    inputs = baseline_inputs(suite, target.path, target.sha256, "toy", None, {})
    rerun = cache.partial(inputs, suite)
    assert rerun is not None
    assert rerun.files == ("tests/test_handoff.py", "tests/test_more.py")
    partial, session = start_baseline(toy.config, suite, target, work, rerun=rerun)
    assert session is not None
    session.close()
    log = partial.log.read_text()
    assert "only tests/test_handoff.py, tests/test_more.py run again" in log
    # The same baseline as a whole run of the edited suite: outcomes, order, coverage.
    whole, _ = start_baseline(toy.config, suite, target, toy.config.reports_dir / ".whole")
    assert [(t.test_id, t.outcome) for t in partial.tests] == [
        (t.test_id, t.outcome) for t in whole.tests
    ]
    assert _arcs(partial) == _arcs(whole)
    before = {t.test_id: t.duration_s for t in first.tests}
    kept = [t for t in partial.tests if t.test_id.partition("::")[0] not in rerun.files]
    assert kept
    assert all(before[t.test_id] == t.duration_s for t in kept)  # read back, not run
    ran = {t.test_id for t in partial.tests} - {t.test_id for t in first.tests}
    assert ran == {
        "tests/test_handoff.py::test_handoff_twice",
        "tests/test_more.py::test_register_once",
    }


def test_a_changed_helper_or_imported_test_module_runs_the_whole_baseline(toy: Toy) -> None:  # noqa: F811
    tests = toy.root / "tests"
    (tests / "test_uses_fence.py").write_text("from tests.test_fence import *  # noqa\n")
    suite, target = staged_dir(toy)
    cache = BaselineCache(toy.config.cache_dir / "baselines")
    run, _ = start_baseline(toy.config, suite, target, toy.config.reports_dir / ".work")
    cache.save(baseline_inputs(suite, target.path, target.sha256, "toy", None, {}), run, 0)

    def partial_after(path: Path, text: str):  # type: ignore[no-untyped-def]
        path.write_text(text)
        suite, target = staged_dir(toy)
        inputs = baseline_inputs(suite, target.path, target.sha256, "toy", None, {})
        return cache.partial(inputs, suite)

    assert partial_after(tests / "helpers.py", "LIMIT = 3\n") is None  # not a test file
    (tests / "helpers.py").unlink()
    fence = tests / "test_fence.py"
    original = fence.read_text()
    # test_uses_fence.py, unchanged, names it (so may import it): everything runs
    assert partial_after(fence, original + "\n# an edit\n") is None
    fence.write_text(original)
    handoff = tests / "test_handoff.py"
    rerun = partial_after(handoff, handoff.read_text() + "\n# an edit\n")
    assert rerun is not None
    assert rerun.why == ("file tests/test_handoff.py changed",)

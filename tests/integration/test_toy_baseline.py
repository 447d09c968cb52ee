"""The baseline stage end to end on a toy target package with its own tests.

No vLLM here: the toy's tests run in the same hermetic child process, under the
same per-test coverage, as vLLM's fence suite does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import coverage
import pytest

from audit.baseline import coverage_map
from audit.baseline.run import run_baseline
from audit.core.environment import sha256_file
from audit.core.errors import BaselineFailed, ExitCode, NoTestsSelected
from audit.setup.config import SuitePath, load_config
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
)


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[TestSource, Target, Path]:
    root = tmp_path / "toy"
    shutil.copytree(TOY, root)
    # The toy package is "installed" for the test process, as vLLM is in site-packages.
    monkeypatch.setenv("PYTHONPATH", str(root))
    path = root / "toypkg" / "fence.py"
    target = Target("toypkg.fence", path, path, sha256_file(path))
    return TestSource(root=root, origin="toy"), target, tmp_path / "reports"


def run(toy: tuple[TestSource, Target, Path], *paths: str, workers: int = 1):  # type: ignore[no-untyped-def]
    source, target, reports = toy
    config = dataclasses.replace(
        load_config(),
        target=target.module,
        reports_dir=reports,
        cache_dir=reports.parent / "cache",
        project_dir=reports.parent,
        offline_models=(),
    )
    entries = tuple(SuitePath("vllm", p) for p in paths)
    suite = stage_suite(config, source, entries, reports / ".work")
    return run_baseline(config, suite, target, reports / ".work", workers=workers), config


def test_each_line_maps_to_the_tests_that_ran_it(toy) -> None:  # type: ignore[no-untyped-def]
    baseline, _ = run(toy, "tests/test_fence.py")
    cmap = coverage_map.build_coverage_map(baseline, "toy")
    source = toy[1].path.read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "del self.pending[block]" in text)
    assert cmap.lines[line] == ("tests/test_fence.py::test_register_then_remove_drains",)
    skip = next(i for i, text in enumerate(source, 1) if text.strip() == "continue")
    assert cmap.lines[skip] == ("tests/test_fence.py::test_register_skips_null_block",)
    assert len(baseline.tests) == 4


def test_region_coverage_counts_lines_branches_and_tests(toy) -> None:  # type: ignore[no-untyped-def]
    baseline, _ = run(toy, "tests/test_fence.py")
    regions = resolve_regions(toy[1].path.read_text(), REGIONS, filename="fence.py")
    by_name = {r.name: r for r in coverage_map.region_coverage(baseline, regions)}
    population = by_name["population"]
    assert population.lines.covered == population.lines.total == 4
    assert population.branches.covered == population.branches.total == 4
    assert len(population.tests) == 3
    assert by_name["removal"].lines.total == 1
    assert by_name["removal"].tests == ("tests/test_fence.py::test_register_then_remove_drains",)
    flush = by_name["flush"]
    assert (flush.lines.covered, flush.lines.total, flush.tests) == (0, 1, ())


def test_reports_are_written_with_contexts(toy) -> None:  # type: ignore[no-untyped-def]
    baseline, config = run(toy, "tests/test_fence.py")
    regions = resolve_regions(toy[1].path.read_text(), REGIONS, filename="fence.py")
    coverage_map.write_html(baseline, config.reports_dir / "coverage")
    coverage_map.write_coverage_map(
        coverage_map.build_coverage_map(baseline, "toy"), config.reports_dir / "map.json"
    )
    html = "".join(p.read_text() for p in (config.reports_dir / "coverage").glob("*fence_py.html"))
    assert "test_register_then_remove_drains" in html
    data = json.loads((config.reports_dir / "map.json").read_text())
    assert data["format"] == 1
    assert {t["id"] for t in data["tests"]} >= {
        "tests/test_fence.py::test_register_skips_null_block"
    }
    del regions


def test_html_rendered_in_the_background_is_put_in_place_at_finish(toy) -> None:  # type: ignore[no-untyped-def]
    """The same pages as the direct write, in the reports only once finished (the
    reports folder is the caller's thread's alone), and kept in the cache."""
    baseline, config = run(toy, "tests/test_fence.py")
    direct, background = config.reports_dir / "direct", config.reports_dir / "coverage"
    coverage_map.write_html(baseline, direct)
    work = config.reports_dir / ".work"
    kept = config.reports_dir / "kept" / "html"
    kept.parent.mkdir()
    html = coverage_map.HtmlInBackground(baseline, background, kept, work)
    # a Ctrl-C at the terminal goes to the run's process group: not to the rendering's
    assert os.getpgid(html.process.pid) != os.getpgid(0)
    assert html.wait() == 0
    assert not background.exists()  # rendered, not yet in place
    html.finish()
    html.finish()  # once: a second close changes nothing

    def pages(folder: Path) -> str:  # without coverage.py's "created at" minute
        text = "".join(p.read_text() for p in sorted(folder.glob("*fence_py.html")))
        return re.sub(r"created at [^<]*", "", text)

    assert "test_register_then_remove_drains" in pages(background)
    assert pages(background) == pages(direct) == pages(kept)
    assert not (work / "coverage-html").exists()


def test_html_that_fails_in_the_background_fails_the_run_at_finish(toy) -> None:  # type: ignore[no-untyped-def]
    baseline, config = run(toy, "tests/test_fence.py")
    missing = dataclasses.replace(baseline, data_file=config.reports_dir / "no.coverage")
    html = coverage_map.HtmlInBackground(
        missing, config.reports_dir / "coverage", None, config.reports_dir / ".work"
    )
    with pytest.raises(coverage_map.HtmlRenderError, match="failed: NoDataError: No data"):
        html.finish()
    assert not (config.reports_dir / "coverage").exists()


def test_the_target_s_own_import_is_measured(toy) -> None:  # type: ignore[no-untyped-def]
    """Coverage starts as the target is imported, not before: its module-level lines
    (the class, each def) are still measured, outside every test's context."""
    baseline, _ = run(toy, "tests/test_fence.py")
    data = coverage.CoverageData(basename=str(baseline.data_file))
    data.read()
    data.set_query_contexts([""])
    imported = set(data.lines(str(toy[1].path)) or ())
    source = toy[1].path.read_text().splitlines()
    wanted = {i for i, text in enumerate(source, 1) if text.startswith(("class ", "    def "))}
    assert wanted
    assert wanted <= imported


def test_red_baseline_names_the_failing_test_and_the_log(toy) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BaselineFailed) as info:
        run(toy, "tests/test_fence.py", "tests/test_red.py")
    assert info.value.exit_code == ExitCode.BASELINE_FAILED
    assert "1 of 5 tests failed" in info.value.summary
    assert "tests/test_red.py::test_always_red" in info.value.details["failed"]
    assert Path(info.value.details["log"]).is_file()


@pytest.mark.parametrize("workers", [2, 3])
def test_tests_dealt_to_forks_give_the_baseline_of_one_process(toy, workers) -> None:  # type: ignore[no-untyped-def]
    """The baseline's tests dealt to several processes: the same tests, outcomes and
    order, and the same lines and arcs under each test's context, as in one."""
    paths = ("tests/test_fence.py", "tests/test_machine.py", "tests/test_handoff.py")
    alone, _ = run(toy, *paths)
    alone_arcs = _arcs_by_context(alone)
    shutil.rmtree(toy[2])
    dealt, _ = run(toy, *paths, workers=workers)
    assert [(t.test_id, t.outcome) for t in dealt.tests] == [
        (t.test_id, t.outcome) for t in alone.tests
    ]
    assert len(alone.tests) > workers  # every process had a test
    assert _arcs_by_context(dealt) == alone_arcs
    assert coverage_map.build_coverage_map(dealt, "toy").lines == (
        coverage_map.build_coverage_map(alone, "toy").lines
    )
    assert not list(Path(dealt.data_file).parent.glob("*.part*"))  # the forks' files merged


def test_a_red_test_in_a_fork_stops_the_baseline(toy) -> None:  # type: ignore[no-untyped-def]
    # Dealt in turn, the red test (the fifth) falls to the second process.
    with pytest.raises(BaselineFailed) as info:
        run(toy, "tests/test_fence.py", "tests/test_red.py", workers=2)
    assert "1 of 5 tests failed" in info.value.summary
    assert "tests/test_red.py::test_always_red" in info.value.details["failed"]


def test_a_fork_that_dies_leaves_its_tests_red(toy) -> None:  # type: ignore[no-untyped-def]
    source, _, reports = toy
    (source.root / "tests" / "test_exit.py").write_text(
        "import os\ndef test_first():\n    pass\ndef test_ends_its_process():\n    os._exit(3)\n"
    )
    with pytest.raises(BaselineFailed) as info:
        run(toy, "tests/test_exit.py", workers=2)
    assert "tests/test_exit.py::test_ends_its_process" in info.value.details["failed"]
    log = (reports / "logs" / "baseline.log").read_text()
    assert "the baseline's fork 1 ended with exit status 3" in log


def _arcs_by_context(baseline) -> dict[str, set[tuple[int, int]]]:  # type: ignore[no-untyped-def]
    import coverage

    data = coverage.CoverageData(basename=baseline.data_file)
    data.read()
    arcs: dict[str, set[tuple[int, int]]] = {}
    for context in data.measured_contexts():
        data.set_query_contexts([context])
        for file in data.measured_files():
            arcs.setdefault(context, set()).update(data.arcs(file) or ())
    return arcs


def test_selection_without_tests_is_its_own_error(toy) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(NoTestsSelected) as info:
        run(toy, "tests/test_empty.py")
    assert info.value.exit_code == ExitCode.NO_TESTS_SELECTED
    assert "vllm:tests/test_empty.py" in info.value.details["selection"]


def test_test_process_has_no_network(toy) -> None:  # type: ignore[no-untyped-def]
    source, _, reports = toy
    home = reports.parent / "cache" / "hf-home"  # in the cache run() gives the audit
    (source.root / "tests" / "test_net.py").write_text(
        "import socket, pytest\n"
        "def test_connect_is_refused():\n"
        "    with pytest.raises(OSError, match='network access is blocked'):\n"
        "        socket.create_connection(('192.0.2.1', 80), timeout=1)\n"
        "def test_hub_is_offline_and_private():\n"
        "    import os\n"
        "    assert os.environ['HF_HUB_OFFLINE'] == '1'\n"
        "    assert os.environ['VLLM_TARGET_DEVICE'] == 'cpu'\n"
        f"    assert os.environ['HF_HOME'] == {str(home)!r}\n"
    )
    with pytest.MonkeyPatch.context() as env:  # a home of the user's own is not inherited
        env.setenv("HF_HOME", str(reports.parent / "users-hf-home"))
        baseline, _ = run(toy, "tests/test_net.py")
    assert [t.outcome.value for t in baseline.tests] == ["passed", "passed"]


def test_every_test_process_iterates_sets_in_one_order(toy) -> None:  # type: ignore[no-untyped-def]
    """vLLM iterates sets of request ids in string-hash order; each test process gets
    the same hash seed, so a verdict that depends on that order is the same in every
    run and in a resumed one."""
    source, _, reports = toy
    orders = reports.parent / "orders.txt"
    (source.root / "tests" / "test_order.py").write_text(
        "def test_record_the_order():\n"
        f"    with open({str(orders)!r}, 'a') as out:\n"
        "        out.write(' '.join({f'r{i}' for i in range(12)}) + '\\n')\n"
    )
    for _ in range(2):
        baseline, _ = run(toy, "tests/test_order.py")
        assert [t.outcome.value for t in baseline.tests] == ["passed"]
    first, second = orders.read_text().splitlines()
    assert first == second

"""--scope file without vLLM: every function's mutants, the group outside the regions,
and the results of such a run, written, read back, rendered and gated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_changes import PATH, REGIONS, SOURCE, line_of

from audit.arguments import build_parser
from audit.cli import check_file_scope
from audit.core.errors import ConfigError, ExitCode
from audit.core.protocol import MutantStatus
from audit.mutation import scope
from audit.mutation.mutants import build_mutants
from audit.rendering.html_report import render_region
from audit.rendering.markdown_report import render_summary
from audit.results.gate import evaluate
from audit.results.report_model import load_results
from audit.results.scores import Tally, format_scores, write_audit
from audit.setup.config import GateThresholds, load_config
from audit.setup.model import CoverageMap, Mutant, MutantResult, Target
from audit.setup.regions import resolve_regions

OUTSIDE = scope.OUTSIDE_REGIONS


def test_the_group_holds_every_function_line_no_region_holds() -> None:
    regions = resolve_regions(SOURCE, REGIONS, filename=PATH)
    group = scope.outside_regions_group(SOURCE, regions)
    assert group.name == OUTSIDE
    inside = {line for region in regions for line in region.lines}
    assert not group.lines & inside
    assert line_of(SOURCE, "total * 2") in group.lines
    assert line_of(SOURCE, "import os") not in group.lines  # not in a function
    assert set(group.functions) == {"Fence.register", "Fence.remove", "Fence.stats"}


def test_every_mutant_of_the_module_is_kept_in_its_region_or_the_group() -> None:
    regions = resolve_regions(SOURCE, REGIONS, filename=PATH)
    functions = scope.all_functions(SOURCE)
    assert functions == ["Fence.register", "Fence.remove", "Fence.stats"]
    everything = build_mutants(SOURCE, PATH, regions, {}, functions=functions)
    place = scope.placer(regions, ("population", "removal", OUTSIDE))
    filed = build_mutants(SOURCE, PATH, regions, {}, functions=functions, place=place)
    kept = {m.id: m.region for m in filed.mutants}
    assert set(kept) == {m.id for m in everything.mutants} | {
        o.id for o in everything.out_of_region
    }
    assert filed.out_of_region == ()
    for mutant in everything.mutants:  # in one region: there still
        assert kept[mutant.id] == mutant.region
    for outside in everything.out_of_region:
        assert kept[outside.id] == OUTSIDE
    assert "Fence.stats" in {m.function for m in filed.mutants if m.region == OUTSIDE}


def test_a_region_the_run_leaves_out_keeps_none_of_its_mutants() -> None:
    regions = resolve_regions(SOURCE, REGIONS, filename=PATH)
    place = scope.placer(regions, ("removal", OUTSIDE))
    assert place((line_of(SOURCE, "if not jobs"),)) == "removal"
    assert place((line_of(SOURCE, "if block == 0"),)) is None  # population: left out
    assert place((line_of(SOURCE, "total * 2"),)) == OUTSIDE
    only_fence = scope.placer(regions, ("removal",))
    assert only_fence((line_of(SOURCE, "total * 2"),)) is None


def file_results(tmp_path: Path, statuses: list[tuple[str, str, str]]) -> Path:
    """audit.json of a --scope file run over SOURCE: (region, function, status) each."""
    target_file = tmp_path / "fence.py"
    target_file.write_text(SOURCE)
    target = Target("pkg.fence", target_file, target_file, "0" * 64)
    regions = resolve_regions(SOURCE, REGIONS, filename=PATH)
    regions = (*regions, scope.outside_regions_group(SOURCE, regions))
    mutants, verdicts = [], {}
    for number, (region, function, status) in enumerate(statuses):
        mutant_id = f"m{number}"
        line = line_of(SOURCE, "total * 2") if function == "Fence.stats" else 7
        mutants.append(
            Mutant(
                mutant_id, "mutmut", region, function, "number", 0, line, (line,), "", (), ("t",)
            )
        )
        verdicts[mutant_id] = MutantResult(
            mutant_id, MutantStatus(status), killed_by="t" if status == "killed" else ""
        )
    path = tmp_path / "audit.json"
    write_audit(
        path,
        target=target,
        vllm_version="0.33.0",
        suite={"tests_from": "sdist", "paths": []},
        mutants=tuple(mutants),
        verdicts=verdicts,
        out_of_region=(),
        regions=regions,
        coverage=(),
        coverage_map=CoverageMap(target, "0.33.0"),
        line_coverage={},
        started_at="2026-01-01T00:00:00+00:00",
        duration_s=1.0,
        scope=scope.FILE,
    )
    return path


STATUSES = [
    ("removal", "Fence.remove", "killed"),
    (OUTSIDE, "Fence.stats", "survived"),
    (OUTSIDE, "Fence.stats", "killed"),
    (OUTSIDE, "Fence.register", "survived"),
]


def test_the_group_is_scored_apart_and_read_by_function(tmp_path: Path) -> None:
    path = file_results(tmp_path, STATUSES)
    document = json.loads(path.read_text())
    assert document["scope"] == "file"
    assert document["score"]["judged"] == 1  # the fence alone
    results = load_results(path)
    assert results.scope == "file"
    assert (results.overall.killed, results.overall.judged) == (1, 1)
    assert results.region(OUTSIDE).tally.judged == 3
    by_function = {f.name: (f.tally.killed, f.tally.judged) for f in results.by_function(OUTSIDE)}
    assert by_function == {"Fence.register": (0, 1), "Fence.stats": (1, 2)}
    summary = render_summary(results)
    assert "### Outside the regions, by function (2)" in summary
    assert "| `Fence.stats` | 50.0% |" in summary
    assert "2 survivors outside the regions" in summary
    assert "### Survivors (0)" in summary  # the fence's own
    page = render_region(results, results.region(OUTSIDE))
    assert "<h2>By function</h2>" in page
    assert page.index("Fence.register</code>") < page.index("Fence.stats</code>")


def test_the_gate_leaves_the_group_out_unless_a_threshold_names_it(tmp_path: Path) -> None:
    results = load_results(file_results(tmp_path, STATUSES))
    fence = GateThresholds(fail_under=99, regions=(("removal", 99),), min_line_coverage=50)
    assert evaluate(results, fence, ("population", "removal")).exit_code == ExitCode.OK
    named = GateThresholds(regions=((OUTSIDE, 50),))
    assert (
        evaluate(results, named, ("population", "removal")).exit_code
        == ExitCode.SCORE_BELOW_THRESHOLD
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.pop("scope"), f"regions.{OUTSIDE}"),
        (lambda d: d.update(scope="everything"), "scope"),
    ],
)
def test_a_damaged_scope_is_refused_naming_the_field(tmp_path: Path, change, field) -> None:  # type: ignore[no-untyped-def]
    path = file_results(tmp_path, STATUSES)
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError) as error:
        load_results(path)
    assert field in error.value.summary


@pytest.mark.parametrize(
    ("argv", "refused"),
    [
        (["mutate", "--scope", "file"], False),
        (["bench", "--scope", "file"], False),  # bench has --scope and no --since
        (["mutate", "--scope", "file", "--vllm-src", "v", "--since", "HEAD~1"], True),
    ],
)
def test_file_scope_is_checked_for_every_command_that_has_it(argv, refused) -> None:  # type: ignore[no-untyped-def]
    args = build_parser().parse_args(argv)
    if refused:
        with pytest.raises(ConfigError, match="--since"):
            check_file_scope(load_config(), args)
    else:
        check_file_scope(load_config(), args)


def test_the_score_table_puts_the_group_after_the_regions_overall_row() -> None:
    """The terminal's table: the overall row ("all") counts the regions only, so the
    group scored apart follows it, marked and footnoted, wherever it sits in the run."""
    killed, survived = MutantStatus.KILLED, MutantStatus.SURVIVED
    tallies = {
        "population": Tally.of([killed, survived]),
        scope.OUTSIDE_REGIONS: Tally.of([killed, survived, survived]),
        "removal": Tally.of([killed]),
    }
    table = format_scores(tallies, Tally.of([killed, survived, killed])).splitlines()
    names = [row.split()[0] for row in table[2:]]
    assert names == ["population", "removal", "all", scope.OUTSIDE_REGIONS, "*"]
    assert "33.3% of 3" in table[5]
    assert table[-1].startswith("* scored apart")
    plain = format_scores({"removal": Tally.of([killed])}, Tally.of([killed]))
    assert "*" not in plain

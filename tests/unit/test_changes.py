"""Pull-request mode without vLLM: the changed lines read from git, the mutant filter,
and the results of such a run, written, read back, rendered and gated.

Each git case builds its repository in a temporary folder, with no configuration of
the user's or the machine's.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from audit.cli import main
from audit.core.errors import ConfigError, ExitCode
from audit.core.protocol import MutantStatus
from audit.mutation import changes
from audit.mutation.catalogue import Stale
from audit.mutation.catalogue_entries import Entry
from audit.mutation.catalogue_mutants import CatalogueMutants
from audit.mutation.changes import OUTSIDE, ChangedCode, changed_since, parse_hunks
from audit.mutation.mutants import build_mutants
from audit.rendering.markdown_report import render_summary
from audit.results.gate import evaluate
from audit.results.report_model import load_results
from audit.results.scores import write_audit
from audit.setup.config import GateThresholds
from audit.setup.model import CoverageMap, Mutant, MutantResult, Target
from audit.setup.region_specs import RegionSpec, Selection, StatementSelector
from audit.setup.regions import resolve_regions

PATH = "pkg/fence.py"
SOURCE = textwrap.dedent(
    """\
    import os


    class Fence:
        def register(self, job, blocks):
            for block in blocks:
                if block == 0:
                    continue
                self.pending.setdefault(block, set()).add(job)

        def remove(self, job, blocks):
            for block in blocks:
                jobs = self.pending[block]
                jobs.discard(job)
                if not jobs:
                    del self.pending[block]

        def stats(self):
            total = len(self.pending)
            return {"blocks": total, "jobs": total * 2}
    """
)
REGIONS = (
    RegionSpec("population", "", (Selection("Fence.register", (StatementSelector("if block"),)),)),
    RegionSpec("removal", "", (Selection("Fence.remove", (StatementSelector("if not jobs"),)),)),
)


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository whose one commit holds SOURCE at PATH."""
    root = tmp_path / "checkout"
    (root / "pkg").mkdir(parents=True)
    (root / PATH).write_text(SOURCE)
    git(root, "init", "--quiet")
    git(root, "add", "--all")
    git(root, "commit", "--quiet", "-m", "base")
    return root


def edit(repo: Path, old: str, new: str, path: str = PATH) -> None:
    text = (repo / path).read_text()
    assert text.count(old) == 1, old
    (repo / path).write_text(text.replace(old, new))


def line_of(text: str, fragment: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if fragment in line)


# --- the diff -----------------------------------------------------------------------


def test_a_hunk_marks_every_added_or_modified_line() -> None:
    diff = "@@ -3,2 +3,3 @@ def f():\n-a\n-b\n+a\n+b\n+c\n@@ -9 +10 @@\n-x\n+y\n"
    assert parse_hunks(diff, 20) == (frozenset({3, 4, 5, 10}), ())


def test_a_pure_deletion_marks_the_lines_on_each_side() -> None:
    assert parse_hunks("@@ -5,3 +4,0 @@\n-a\n-b\n-c\n", 10) == (frozenset({4, 5}), (4,))


def test_a_deletion_at_the_top_or_the_end_marks_only_lines_that_exist() -> None:
    assert parse_hunks("@@ -1,2 +0,0 @@\n-a\n-b\n", 10) == (frozenset({1}), (0,))
    assert parse_hunks("@@ -11,2 +10,0 @@\n-a\n-b\n", 10) == (frozenset({10}), (10,))


def test_working_tree_changes_are_read_in_the_new_numbering(repo: Path) -> None:
    edit(repo, "import os\n", "import os\nimport sys\n")
    edit(repo, "total * 2", "total * 3")
    changed = changed_since(repo, "HEAD", PATH)
    text = (repo / PATH).read_text()
    assert changed.lines == {2, line_of(text, "total * 3")}
    assert changed.commit == git(repo, "rev-parse", "HEAD").strip()
    assert changed.old_path == PATH
    assert not changed.renamed


def test_a_deleted_if_draws_the_lines_around_it(repo: Path) -> None:
    edit(repo, "            if block == 0:\n                continue\n", "")
    changed = changed_since(repo, "HEAD", PATH)
    text = (repo / PATH).read_text()
    before = line_of(text, "for block in blocks")
    assert changed.deletions == (before,)
    assert changed.lines == {before, before + 1}


def test_committed_changes_since_an_older_commit_count_too(repo: Path) -> None:
    base = git(repo, "rev-parse", "HEAD").strip()
    edit(repo, "total * 2", "total * 3")
    git(repo, "commit", "--quiet", "-am", "change")
    edit(repo, "if not jobs:", "if jobs is None or not jobs:")
    changed = changed_since(repo, base[:10], PATH)
    text = (repo / PATH).read_text()
    assert changed.lines == {line_of(text, "total * 3"), line_of(text, "if jobs is None")}
    assert changed.commit == base
    assert changed.ref == base[:10]


def test_a_renamed_file_is_compared_with_its_old_path(repo: Path) -> None:
    git(repo, "mv", PATH, "pkg/renamed.py")
    edit(repo, "total * 2", "total * 3", path="pkg/renamed.py")
    changed = changed_since(repo, "HEAD", "pkg/renamed.py")
    assert changed.old_path == PATH
    assert changed.renamed
    text = (repo / "pkg/renamed.py").read_text()
    assert changed.lines == {line_of(text, "total * 3")}  # not the whole file


def test_a_file_new_since_the_ref_is_changed_throughout(repo: Path) -> None:
    (repo / "pkg/other.py").write_text("def f():\n    return 1\n")
    git(repo, "add", "pkg/other.py")
    changed = changed_since(repo, "HEAD", "pkg/other.py")
    assert changed.old_path == ""
    assert changed.lines == {1, 2}


def test_nothing_changed_gives_no_line(repo: Path) -> None:
    changed = changed_since(repo, "HEAD", PATH)
    assert changed.lines == frozenset()
    assert changed.deletions == ()


def test_an_unknown_ref_is_a_usage_error_naming_it(repo: Path) -> None:
    with pytest.raises(ConfigError) as error:
        changed_since(repo, "no-such-branch", PATH)
    assert error.value.exit_code == ExitCode.USAGE
    assert "no-such-branch" in error.value.summary
    assert "fetch" in error.value.details["next"]


def test_a_ref_that_looks_like_an_option_is_refused(repo: Path) -> None:
    with pytest.raises(ConfigError, match="does not know '--output=x'"):
        changed_since(repo, "--output=x", PATH)


def test_a_folder_that_is_not_a_git_repository_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / PATH).write_text(SOURCE)
    with pytest.raises(ConfigError, match="is not a git repository") as error:
        changed_since(tmp_path, "HEAD", PATH)
    assert "--vllm-src" in error.value.details["next"]


def test_an_untracked_target_is_refused(repo: Path) -> None:
    (repo / "pkg/loose.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match=r"does not track pkg/loose\.py"):
        changed_since(repo, "HEAD", "pkg/loose.py")


# --- the filter ---------------------------------------------------------------------


def changed_at(*fragments: str) -> ChangedCode:
    lines = frozenset(line_of(SOURCE, f) for f in fragments)
    return ChangedCode("HEAD~1", "a" * 40, PATH, PATH, lines, ())


def test_functions_holding_changed_lines_are_named() -> None:
    lines = changed_at("if not jobs", "total * 2").lines
    assert changes.functions_holding(SOURCE, lines) == ("Fence.remove", "Fence.stats")
    assert changes.functions_holding(SOURCE, {1}) == ()  # an import: no function


def test_the_group_holds_changed_lines_outside_every_region_inside_functions() -> None:
    regions = resolve_regions(SOURCE, REGIONS, filename=PATH)
    changed = changed_at("import os", "if not jobs", "total * 2", "jobs.discard")
    group = changes.outside_group(changed, SOURCE, regions)
    assert group.name == OUTSIDE
    assert group.lines == {line_of(SOURCE, "total * 2"), line_of(SOURCE, "jobs.discard")}
    assert set(group.functions) == {"Fence.remove", "Fence.stats"}


def test_only_mutants_on_changed_lines_are_kept_each_in_its_place() -> None:
    regions = resolve_regions(SOURCE, REGIONS, filename=PATH)
    changed = changed_at("if not jobs", "total * 2")
    place = changes.placer(changed, regions, ("population", "removal"))
    mutant_set = build_mutants(
        SOURCE,
        PATH,
        regions,
        {},
        functions=changes.functions_holding(SOURCE, changed.lines),
        place=place,
        near=changed.lines,
    )
    assert mutant_set.mutants
    assert mutant_set.out_of_region == ()
    for mutant in mutant_set.mutants:
        assert changed.lines & set(mutant.changed_lines), mutant.id
        expected = "removal" if mutant.function == "Fence.remove" else OUTSIDE
        assert mutant.region == expected, mutant.id
    everything = build_mutants(SOURCE, PATH, regions, {}, functions=["Fence.stats"])
    on_line = [m for m in everything.out_of_region if m.line == line_of(SOURCE, "total * 2")]
    kept = {m.id for m in mutant_set.mutants}
    assert on_line
    assert all(m.id in kept for m in on_line)


def test_the_placer_leaves_out_unchanged_and_left_out_code() -> None:
    regions = resolve_regions(SOURCE, REGIONS, filename=PATH)
    register_if = line_of(SOURCE, "if block == 0")
    remove_if = line_of(SOURCE, "if not jobs")
    stats = line_of(SOURCE, "total * 2")
    changed = ChangedCode("r", "a" * 40, PATH, PATH, frozenset({register_if, remove_if, stats}), ())
    place = changes.placer(changed, regions, ("removal",))
    assert place((stats - 1,)) is None  # no changed line
    assert place((remove_if,)) == "removal"
    assert place((register_if,)) is None  # population: the run left it out
    assert place((stats,)) == OUTSIDE
    assert place((remove_if - 1, remove_if)) == OUTSIDE  # across the region's edge


def test_catalogue_entries_are_kept_when_they_touch_a_changed_line() -> None:
    def mutant(name: str, lines: tuple[int, ...], module: str = "") -> Mutant:
        return Mutant(
            f"catalogue:{name}",
            "catalogue",
            "removal",
            "Fence.remove",
            name,
            0,
            lines[0],
            lines,
            "",
            (),
            (),
            module=module,
        )

    def entry(name: str) -> Entry:
        return Entry(name, "removal", name, "", "I5", "", "vllm", "", (), Path(f"{name}.toml"))

    remove_if = line_of(SOURCE, "if not jobs")
    catalogue = CatalogueMutants(
        mutants=(
            mutant("on", (remove_if,)),
            mutant("off", (2,)),
            mutant("worker", (remove_if,), "w"),
        ),
        stale=(Stale(entry("stale"), "anchor gone"),),
        entries={f"catalogue:{n}": entry(n) for n in ("on", "off", "worker", "stale")},
    )
    kept = changes.changed_catalogue(catalogue, changed_at("if not jobs"))
    assert [m.id for m in kept.mutants] == ["catalogue:on"]
    assert set(kept.entries) == {"catalogue:on", "catalogue:stale"}
    assert kept.stale == catalogue.stale


# --- the results of a pull-request run ----------------------------------------------


def pr_results(tmp_path: Path, statuses: dict[str, str], lines: frozenset[int]) -> Path:
    """audit.json of a pull-request run over SOURCE, one mutant per (region: status)."""
    target_file = tmp_path / "fence.py"
    target_file.write_text(SOURCE)
    target = Target("pkg.fence", target_file, target_file, "0" * 64)
    regions = resolve_regions(SOURCE, REGIONS, filename=PATH)
    changed = ChangedCode("HEAD~1", "b" * 40, PATH, PATH, lines, ())
    regions = (*regions, changes.outside_group(changed, SOURCE, regions))
    mutants, verdicts = [], {}
    for number, (region, status) in enumerate(statuses.items()):
        mutant_id = f"m{number}"
        mutants.append(
            Mutant(
                mutant_id,
                "mutmut",
                region.split("#")[0],
                "Fence.stats",
                "number",
                0,
                20,
                (20,),
                "--- a\n+++ b\n",
                (),
                ("tests/t.py::t",),
            )
        )
        verdicts[mutant_id] = MutantResult(
            mutant_id, MutantStatus(status), killed_by="tests/t.py::t" if status == "killed" else ""
        )
    path = tmp_path / "audit.json"
    write_audit(
        path,
        target=target,
        vllm_version="0.33.0",
        suite={"tests_from": "checkout", "paths": []},
        mutants=tuple(mutants),
        verdicts=verdicts,
        out_of_region=(),
        regions=regions,
        coverage=(),
        coverage_map=CoverageMap(target, "0.33.0"),
        line_coverage={},
        started_at="2026-01-01T00:00:00+00:00",
        duration_s=1.0,
        since=changes.record(changed),
    )
    return path


def test_since_is_written_and_read_back(tmp_path: Path) -> None:
    lines = frozenset({5, 6, 7, 20})
    path = pr_results(tmp_path, {"removal": "killed", OUTSIDE: "survived"}, lines)
    document = json.loads(path.read_text())
    assert document["since"]["lines"] == [[5, 7], [20, 20]]
    assert document["since"]["score"]["judged"] == 2
    assert document["score"]["judged"] == 1  # the group is scored apart
    results = load_results(path)
    assert results.since is not None
    assert results.since.lines == ((5, 7), (20, 20))
    assert results.since.commit == "b" * 40
    assert (results.since.tally.killed, results.since.tally.judged) == (1, 2)
    assert (results.overall.killed, results.overall.judged) == (1, 1)
    assert results.region(OUTSIDE).tally.survived == 1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["since"].update(commit="HEAD"), "since.commit"),
        (lambda d: d["since"].update(lines=[[7, 5]]), "since.lines[0]"),
        (lambda d: d["since"].update(lines=[[5, 7], [6, 9]]), "since.lines[1]"),
        (lambda d: d["since"].update(surprise=1), "since.surprise"),
        (lambda d: d["since"]["score"].update(killed=2), "since.score.killed"),
        (lambda d: d.pop("since"), f"regions.{OUTSIDE}"),
    ],
)
def test_a_damaged_since_is_refused_naming_the_field(tmp_path: Path, change, field) -> None:  # type: ignore[no-untyped-def]
    path = pr_results(tmp_path, {"removal": "killed", OUTSIDE: "survived"}, frozenset({5, 20}))
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError) as error:
        load_results(path)
    assert field in error.value.summary


def test_the_summary_leads_with_the_changed_code_score(tmp_path: Path) -> None:
    statuses = {"removal": "killed", "removal#2": "survived", OUTSIDE: "survived"}
    results = load_results(pr_results(tmp_path, statuses, frozenset({5, 20})))
    summary = render_summary(results)
    first = summary.splitlines()[0]
    assert first == "## fence-audit: 1 of 3 mutants in the changed code killed (33.3%)"
    assert "`HEAD~1` (`bbbbbbbbbbbb`)" in summary
    survivors = summary.index("### Survivors in the changed code (2)")
    assert survivors < summary.index("### Fence regions: 50.0%")
    assert f"| {OUTSIDE} |" in summary
    assert "### Survivors (" not in summary  # not listed twice


def test_the_summary_says_when_nothing_changed(tmp_path: Path) -> None:
    results = load_results(pr_results(tmp_path, {}, frozenset()))
    summary = render_summary(results)
    assert summary.startswith("## fence-audit: nothing changed in `fence.py` since `HEAD~1`")
    assert "no mutant was judged" in summary


def test_the_gate_checks_only_regions_holding_changed_code(tmp_path: Path) -> None:
    path = pr_results(tmp_path, {"removal": "killed", OUTSIDE: "survived"}, frozenset({5, 20}))
    results = load_results(path)
    thresholds = GateThresholds(fail_under=99, regions=(("population", 99), ("removal", 99)))
    outcome = evaluate(results, thresholds, ("population", "removal"))
    assert outcome.exit_code == ExitCode.OK  # the group's survivor is not counted
    assert outcome.unchanged == ("population",)
    assert "score of population: not checked (no changed code in it)" in outcome.render()
    named = GateThresholds(regions=((OUTSIDE, 50),))
    assert (
        evaluate(results, named, ("population", "removal")).exit_code
        == ExitCode.SCORE_BELOW_THRESHOLD
    )


def test_since_without_a_checkout_is_refused_before_anything_runs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr("audit.core.environment.installed_vllm", started)
    assert main(["mutate", "--since", "HEAD~1"]) == ExitCode.USAGE
    assert capsys.readouterr().err == (
        "fence-audit: --since HEAD~1 needs --vllm-src: the changes are read from a git checkout"
        "; next: add --vllm-src PATH (the root of the vLLM checkout holding the change), or "
        "drop --since to audit the whole fence\n"
    )

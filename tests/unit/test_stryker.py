"""The Stryker report: the results view rendered, checked against the published schema."""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from stryker_schema import SCHEMA_PACKAGE, SCHEMA_PACKAGE_VERSION, published_schema

from audit.cli import main
from audit.core import environment, files, outputs
from audit.core.errors import CannotWrite, ConfigError
from audit.core.protocol import MutantStatus
from audit.rendering.reports import write_reports
from audit.rendering.stryker import (
    STATUSES,
    STRYKER_SCHEMA_VERSION,
    SourceNotHere,
    render_mutation_report,
)
from audit.results.report_model import load_results
from audit.results.view import AuditResults
from audit.setup.config import default_cache_dir, load_config

SOURCE = """\
def release(pending, ids):
    for bid in ids or ():
        if not pending[bid]:
            del pending[bid]
    return sorted(
        pending,
    )
"""
TEST_A = "tests/test_fence.py::test_release_drops_empty[True]"
TEST_B = "tests/test_fence.py::TestOrder::test_sorted"
TEST_C = "tests/test_other.py::test_noop"


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return published_schema(default_cache_dir() / "schemas")


def mutated(line: int, new_text: str, last: int | None = None) -> str:
    """The unified diff (as audit.json stores it) of SOURCE with lines line..last replaced."""
    original = SOURCE.splitlines(keepends=True)
    changed = [*original]
    changed[line - 1 : last or line] = new_text.splitlines(keepends=True)
    return "".join(difflib.unified_diff(original, changed, "a/fence.py", "b/fence.py", n=2))


def mutant(identifier: str, line: int, status: str, diff: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": identifier,
        "region": "removal",
        "origin": "mutmut",
        "function": "release",
        "operator": identifier.split(":")[1].partition("@")[0],
        "line": line,
        "status": status,
        "killed_by": None,
        "failure": None,
        "covered_by": [TEST_A, TEST_B],
        "tests_run": [TEST_A, TEST_B],
        "duration_s": 0.25,
        "cached": False,
        "diff": diff,
        **extra,
    }


TALLY = {
    **{"killed": 1, "survived": 1, "timeout": 1, "no_tests": 1, "error": 1},
    **{"judged": 3, "score": 33.33},
}


@pytest.fixture
def audit(tmp_path: Path) -> dict[str, Any]:
    target = tmp_path / "fence.py"
    target.write_text(SOURCE)
    mutants = [
        mutant(
            "release:remove_unary_ops@2:11-2:27#0",
            3,
            "killed",
            mutated(3, "        if pending[bid]:\n"),
            killed_by=TEST_A,
            failure="AssertionError: block 3 still fenced",
            tests_run=[TEST_A],
        ),
        mutant(
            "release:swap_op@1:15-1:24#0", 2, "survived", mutated(2, "    for bid in ids and ():\n")
        ),
        mutant("release:statement@3:12-3:28#0", 4, "timeout", mutated(4, "            pass\n")),
        mutant(
            "release:arg_removal@4:11-6:5#0",
            5,
            "no_tests",
            mutated(6, "        None,\n"),
            covered_by=[],
            tests_run=[],
        ),
        # No position in its id: placed on the lines its diff changes.
        mutant(
            "release:catalogue/return_empty",
            5,
            "error",
            mutated(5, "    return []\n", last=7),
            origin="catalogue",
            failure="SyntaxError: invalid syntax",
            covered_by=[TEST_C],
        ),
    ]
    return {
        "format": 2,
        "tool": {"name": "fence-audit", "version": "0.1.0.dev0"},
        "vllm_version": "0.33.0",
        "target": {
            "module": "pkg.fence",
            "path": str(target),
            "sha256": hashlib.sha256(SOURCE.encode()).hexdigest(),
        },
        "suite": {"tests_from": "hand-written", "paths": ["project:tests/test_fence.py"]},
        "engine": "fork",
        "started_at": "2025-01-01T00:00:00+00:00",
        "duration_s": 1.5,
        "score": TALLY,
        "regions": {"removal": TALLY},  # what its mutants add up to (checked on read)
        "tests": [],
        "source": {"path": str(target), "functions": []},
        "mutants": mutants,
        "out_of_region": [],
    }


def saved(tmp_path: Path, audit: dict[str, Any]) -> Path:
    """``audit`` saved as an audit.json."""
    path = tmp_path / "audit.json"
    path.write_text(json.dumps(audit))
    return path


def loaded(tmp_path: Path, audit: dict[str, Any]) -> AuditResults:
    return load_results(saved(tmp_path, audit))


def written(tmp_path: Path, audit: dict[str, Any]) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(render_mutation_report(loaded(tmp_path, audit)))
    return report


def by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (file,) = report["files"].values()
    return {m["id"]: m for m in file["mutants"]}


def test_report_is_valid_under_the_published_schema(
    schema: dict[str, Any], audit: dict[str, Any], tmp_path: Path
) -> None:
    report = written(tmp_path, audit)
    validator = jsonschema.validators.validator_for(schema)  # the schema's $schema: draft 7
    validator.check_schema(schema)
    validator(schema).validate(report)
    assert report["schemaVersion"] == STRYKER_SCHEMA_VERSION == "2"


@pytest.mark.parametrize(
    ("ours", "stryker_status"),
    [
        ("killed", "Killed"),
        ("survived", "Survived"),
        ("timeout", "Timeout"),
        ("no_tests", "NoCoverage"),
        ("error", "RuntimeError"),
    ],
)
def test_each_status_maps_to_its_stryker_status(
    ours: str, stryker_status: str, audit: dict[str, Any], tmp_path: Path
) -> None:
    (ours_mutant,) = [m for m in audit["mutants"] if m["status"] == ours]
    assert by_id(written(tmp_path, audit))[ours_mutant["id"]]["status"] == stryker_status


def test_an_unknown_status_is_refused_when_the_results_are_read(
    audit: dict[str, Any], tmp_path: Path
) -> None:
    audit["mutants"][0]["status"] = "flaky"
    with pytest.raises(ConfigError) as error:
        written(tmp_path, audit)
    assert "flaky" in error.value.render()


def test_every_status_has_a_stryker_status() -> None:
    assert set(STATUSES) == set(MutantStatus)


def test_killing_and_covering_tests_are_all_listed_under_test_files(
    audit: dict[str, Any], tmp_path: Path
) -> None:
    report = written(tmp_path, audit)
    listed = {t["id"] for f in report["testFiles"].values() for t in f["tests"]}
    for m in by_id(report).values():
        assert set(m.get("killedBy", [])) <= listed
        assert set(m.get("coveredBy", [])) <= listed
    files = report["testFiles"].items()
    names = {t["id"]: f"{file}::{t['name']}" for file, f in files for t in f["tests"]}
    killed = by_id(report)["release:remove_unary_ops@2:11-2:27#0"]
    assert [names[t] for t in killed["killedBy"]] == [TEST_A]
    assert [names[t] for t in killed["coveredBy"]] == [TEST_A, TEST_B]


def test_tests_are_grouped_by_the_file_before_the_double_colon(
    audit: dict[str, Any], tmp_path: Path
) -> None:
    files = written(tmp_path, audit)["testFiles"]
    assert files == {
        "tests/test_fence.py": {
            "tests": [
                {"id": "0", "name": "TestOrder::test_sorted"},
                {"id": "1", "name": "test_release_drops_empty[True]"},
            ]
        },
        "tests/test_other.py": {"tests": [{"id": "2", "name": "test_noop"}]},
    }


def test_the_file_is_keyed_by_module_path_and_carries_the_audited_source(
    audit: dict[str, Any], tmp_path: Path
) -> None:
    files = written(tmp_path, audit)["files"]
    assert list(files) == ["pkg/fence.py"]
    assert files["pkg/fence.py"]["language"] == "python"
    assert files["pkg/fence.py"]["source"] == SOURCE
    assert len(files["pkg/fence.py"]["mutants"]) == len(audit["mutants"])


def test_location_is_the_mutated_node_with_one_based_columns(
    audit: dict[str, Any], tmp_path: Path
) -> None:
    mutants = by_id(written(tmp_path, audit))
    one_line = mutants["release:remove_unary_ops@2:11-2:27#0"]
    assert one_line["location"] == {
        "start": {"line": 3, "column": 12},
        "end": {"line": 3, "column": 28},
    }
    assert one_line["replacement"] == "pending[bid]"
    multi_line = mutants["release:arg_removal@4:11-6:5#0"]
    assert multi_line["location"] == {
        "start": {"line": 5, "column": 12},
        "end": {"line": 7, "column": 6},
    }
    assert multi_line["replacement"] == "sorted(\n        None,\n    )"


def test_an_id_without_position_spans_the_lines_its_diff_changes(
    audit: dict[str, Any], tmp_path: Path
) -> None:
    located = by_id(written(tmp_path, audit))["release:catalogue/return_empty"]
    assert located["location"] == {
        "start": {"line": 5, "column": 1},
        "end": {"line": 7, "column": 6},
    }
    assert located["replacement"] == "    return []"


def test_a_diff_that_does_not_fit_the_source_gives_no_replacement(
    audit: dict[str, Any], tmp_path: Path
) -> None:
    audit["mutants"][0]["diff"] = audit["mutants"][0]["diff"].replace("if not", "if nott")
    located = by_id(written(tmp_path, audit))["release:remove_unary_ops@2:11-2:27#0"]
    assert "replacement" not in located
    assert located["location"]["start"] == {"line": 3, "column": 12}


def test_region_failure_and_timing_become_description_reason_and_duration(
    audit: dict[str, Any], tmp_path: Path
) -> None:
    killed = by_id(written(tmp_path, audit))["release:remove_unary_ops@2:11-2:27#0"]
    assert killed["mutatorName"] == "remove_unary_ops"
    assert killed["description"] == "removal"
    assert killed["statusReason"] == "AssertionError: block 3 still fenced"
    assert (killed["duration"], killed["testsCompleted"]) == (250.0, 1)
    survived = by_id(written(tmp_path, audit))["release:swap_op@1:15-1:24#0"]
    assert "statusReason" not in survived
    assert "killedBy" not in survived


def test_a_source_changed_since_the_audit_is_not_rendered_over(
    audit: dict[str, Any], tmp_path: Path
) -> None:
    Path(audit["target"]["path"]).write_text(SOURCE + "# edited\n")
    with pytest.raises(SourceNotHere, match=r"pkg\.fence"):
        written(tmp_path, audit)


def test_without_the_audited_source_the_other_reports_are_written_and_mutation_json_removed(
    audit: dict[str, Any], tmp_path: Path
) -> None:
    Path(audit["target"]["path"]).unlink()
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "mutation.json").write_text("from another run")
    outputs.claim(reports, "mutation.json")  # fence-audit's: one it did not write is kept
    written_ = write_reports(loaded(tmp_path, audit), reports)
    assert audit["target"]["path"] in written_.skipped["mutation.json"]
    assert not (reports / "mutation.json").exists()  # never beside results it does not show
    assert (reports / "index.html").is_file()
    assert (reports / "junit.xml").is_file()


@pytest.mark.vllm
def test_results_from_another_machine_render_over_the_installed_vllm_of_their_version(
    audit: dict[str, Any], tmp_path: Path
) -> None:
    module = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"
    version = load_config().vllm_version  # the configured release, installed here
    installed = environment.installed_file(environment.installed_vllm(version), module)
    audit["vllm_version"] = version
    audit["target"] = {
        "module": module,
        "path": "/home/runner/site-packages/" + module.replace(".", "/") + ".py",  # CI's
        "sha256": environment.sha256_file(installed),
    }
    report = written(tmp_path, audit)
    (file,) = report["files"].values()
    assert file["source"] == installed.read_text()


def test_writing_replaces_the_report_and_leaves_no_temporary_file(
    audit: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "reports" / "mutation.json"
    out.parent.mkdir()
    out.write_text("old")
    assert write_reports(loaded(tmp_path, audit), out.parent).mutation == out
    assert json.loads(out.read_text())["schemaVersion"] == "2"
    assert [p.name for p in out.parent.rglob("*.tmp")] == []
    assert out.read_text().startswith('{\n "schemaVersion"')  # indent=1


def test_a_failed_write_keeps_the_old_report_and_no_temporary_file(
    audit: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "reports" / "mutation.json"
    out.parent.mkdir()
    out.write_text("old")
    results = loaded(tmp_path, audit)

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", disk_full)
    with pytest.raises(CannotWrite, match="No space"):
        write_reports(results, out.parent)
    assert out.read_text() == "old"
    assert [p.name for p in out.parent.rglob("*") if p.suffix == ".tmp"] == []


def test_the_report_command_rewrites_mutation_json_from_saved_results(
    audit: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = saved(tmp_path, audit)
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "mutation.json").write_text("stale")
    outputs.claim(reports, "mutation.json")  # an earlier run's (the CLI refuses any other)
    config = tmp_path / "pyproject.toml"
    # this project's own pyproject must not leak into the test
    config.write_text("[tool.fence-audit]\n")
    argv = ["report", "--config", str(config), "--reports", str(reports), "--results", str(path)]
    assert main(argv) == 0
    expected = render_mutation_report(load_results(path))
    assert (reports / "mutation.json").read_text() == expected
    assert json.loads(expected)["files"]["pkg/fence.py"]["source"] == SOURCE
    assert capsys.readouterr().out.startswith(f"fence-audit: report {reports / 'index.html'}")


def test_the_report_command_says_why_mutation_json_is_not_written(
    audit: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = saved(tmp_path, audit)
    Path(audit["target"]["path"]).unlink()  # results downloaded from another machine
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.fence-audit]\n")
    reports = tmp_path / "reports"
    argv = ["report", "--config", str(config), "--reports", str(reports), "--results", str(path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert (
        f"fence-audit: mutation.json not written: the audited pkg.fence ({audit['target']['path']})"
        in out
    )
    assert (reports / "summary.md").is_file()


def test_schema_helper_skips_with_a_reason_when_neither_cache_nor_network(
    tmp_path: Path,
) -> None:
    with pytest.raises(pytest.skip.Exception, match=r"not cached .* unreachable"):
        published_schema(tmp_path, url="http://127.0.0.1:9/unreachable.tgz")


def test_schema_helper_reuses_the_cache_without_network(
    schema: dict[str, Any], tmp_path: Path
) -> None:
    cached = default_cache_dir() / "schemas" / f"{SCHEMA_PACKAGE}-{SCHEMA_PACKAGE_VERSION}.tgz"
    copy = tmp_path / cached.name
    copy.write_bytes(cached.read_bytes())
    assert published_schema(tmp_path, url="http://127.0.0.1:9/unreachable.tgz") == schema

"""fence-audit removes only what it wrote (issue 13, item 4), and a reports folder it
cannot write is one clear line, exit 1, before the baseline (item 7).

Each case runs the command line in-process: ``report`` writes every report from a saved
results file without running a test; ``coverage`` and ``mutate`` are stopped before the
baseline (the index they would fetch vLLM's tests from does not answer).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import coverage
import pytest

from audit.baseline.coverage_map import write_html
from audit.cli import main
from audit.core import files
from audit.core.environment import sha256_file
from audit.core.errors import CannotWrite, ConfigError, ExitCode
from audit.core.outputs import LOCK, MANIFEST
from audit.rendering.reports import write_reports
from audit.results.report_model import load_results
from audit.setup.config import load_config
from audit.setup.model import BaselineRun, Target
from audit.setup.sources import TestSource
from audit.setup.suite import stage_suite

RESULTS = Path(__file__).parents[1] / "unit" / "data" / "results.json"


@pytest.fixture(autouse=True)
def no_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is fetched: a command that gets past the reports check stops at exit 8."""
    monkeypatch.setenv("FENCE_AUDIT_INDEX_URL", "http://127.0.0.1:9/simple")


def run(command: str, tmp_path: Path, reports: Path | str) -> int:
    """``fence-audit COMMAND --reports REPORTS`` with an empty pyproject (the defaults)."""
    config = tmp_path / "pyproject.toml"
    if not config.exists():
        config.write_text("[tool.fence-audit]\n")
    argv = [command, "--config", str(config), "--reports", str(reports)]
    if command == "report":
        argv += ["--results", str(RESULTS)]
    else:
        argv += ["--cache-dir", str(tmp_path / "cache")]
    return main(argv)


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The error: one line on stderr, no traceback: what failed, where, what to do next."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    assert " (folder: " in err or " (manifest: " in err, err
    assert "; next: " in err, err
    return err


def names(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_a_users_file_in_regions_is_kept_and_the_report_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "reports"
    assert run("report", tmp_path, reports) == ExitCode.OK
    (reports / "regions" / "notes.txt").write_text("my notes")
    before = snapshot(reports)
    capsys.readouterr()
    assert run("report", tmp_path, reports) == ExitCode.USAGE
    assert (
        f"holds files fence-audit did not write (folder: {reports}; files: regions/notes.txt)"
        in one_line(capsys)
    )
    assert snapshot(reports) == before  # the notes, and the earlier reports whole


def test_a_users_file_in_coverage_is_kept_and_the_html_refused(tmp_path: Path) -> None:
    run_ = baseline_run(tmp_path)
    folder = tmp_path / "reports" / "coverage"
    write_html(run_, folder)
    assert (folder / "index.html").is_file()
    (folder / "notes.txt").write_text("my notes")
    before = snapshot(folder)
    with pytest.raises(ConfigError, match="did not write") as info:
        write_html(run_, folder)
    assert info.value.details["files"] == "coverage/notes.txt"
    assert snapshot(folder) == before
    (folder / "notes.txt").unlink()
    write_html(run_, folder)  # its own files it replaces
    assert (folder / "index.html").is_file()
    assert not list(folder.parent.glob(".coverage.part-*"))


@pytest.mark.parametrize("command", ["report", "coverage", "mutate"])
def test_reports_dot_in_a_repository_is_refused_before_anything_runs(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--reports .`` in a repository would have taken its coverage/ folder."""
    repo = tmp_path / "repo"
    (repo / "coverage").mkdir(parents=True)
    (repo / "coverage" / "index.html").write_text("the project's own coverage")
    (repo / "src").mkdir()
    (repo / ".gitignore").write_text("")
    before = snapshot(repo)
    assert run(command, tmp_path, repo) == ExitCode.USAGE
    message = one_line(capsys)
    assert (
        f"the reports folder holds files fence-audit did not write (folder: {repo}; "
        "files: coverage/, src/); next: choose an empty folder with --reports, or move them out"
    ) in message
    assert snapshot(repo) == before
    assert names(repo) == [".gitignore", "coverage", "src"]  # no manifest either
    assert not (tmp_path / "cache").exists()  # nothing fetched: refused first


def test_a_folder_holding_only_dotfiles_is_used_and_the_manifest_lists_every_file(
    tmp_path: Path,
) -> None:
    """The repository's reports/ holds its committed .gitkeep."""
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / ".gitkeep").write_text("")
    assert run("report", tmp_path, reports) == ExitCode.OK
    assert (reports / ".gitkeep").is_file()
    manifest = json.loads((reports / MANIFEST).read_text())
    assert manifest["format"] == 1
    on_disk = {
        path.relative_to(reports).as_posix() + ("/" if path.is_dir() else "")
        for path in reports.rglob("*")
        if path.name not in (".gitkeep", MANIFEST)
    }
    assert on_disk == set(manifest["written"])
    assert {"index.html", "regions/", "summary.md", "junit.xml"} <= on_disk
    assert run("report", tmp_path, reports) == ExitCode.OK  # its own folder, again


@pytest.fixture
def read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A reports folder nobody may create a file in. Root ignores the mode, so for root
    creating anything in it fails as the kernel would make it fail for anyone else."""
    folder = tmp_path / "reports"
    folder.mkdir()
    folder.chmod(0o555)
    if os.geteuid() == 0:
        real_open, real_mkdir = os.open, os.mkdir

        def refused(path: object) -> None:
            if Path(os.fsdecode(path)).parent == folder:  # type: ignore[arg-type]
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

        def open_(path: str, flags: int, *args: int, **kwargs: int) -> int:
            if flags & os.O_CREAT:
                refused(path)
            return real_open(path, flags, *args, **kwargs)

        def mkdir(path: str, *args: int, **kwargs: int) -> None:
            refused(path)
            real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", open_)
        monkeypatch.setattr(os, "mkdir", mkdir)
    yield folder
    folder.chmod(0o755)


@pytest.mark.parametrize("command", ["report", "coverage"])
def test_a_read_only_reports_folder_is_one_line_and_exit_1(
    command: str, read_only: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(command, tmp_path, read_only) == ExitCode.USAGE
    message = one_line(capsys)
    assert f"the reports folder is not writable (folder: {read_only}; error: Permission" in message
    assert "; next: make it writable, or choose another folder with --reports" in message
    assert names(read_only) == []
    assert not (tmp_path / "cache").exists()  # checked before anything else


def test_a_reports_path_naming_a_file_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "results.txt"
    path.write_text("mine")
    assert run("report", tmp_path, path) == ExitCode.USAGE
    assert (
        f"the reports folder is a file, not a folder (folder: {path}); "
        "next: choose a folder with --reports"
    ) in one_line(capsys)
    assert path.read_text() == "mine"


def test_a_work_folder_fence_audit_did_not_create_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "reports"
    assert run("report", tmp_path, reports) == ExitCode.OK
    (reports / ".work" / "suite").mkdir(parents=True)
    (reports / ".work" / "suite" / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert run("coverage", tmp_path, reports) == ExitCode.USAGE
    assert "did not write (folder: " in (line := one_line(capsys))
    assert "; files: .work/); next: " in line
    assert (reports / ".work" / "suite" / "notes.txt").read_text() == "mine"


def test_a_suite_root_fence_audit_did_not_stage_is_kept(tmp_path: Path) -> None:
    (tmp_path / "vllm" / "tests" / "v1").mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text("[tool.fence-audit.suite]\npaths = []\n")
    config = load_config(tmp_path / "pyproject.toml")
    source = TestSource(tmp_path / "vllm", "test folder")
    work = tmp_path / "work"
    notes = work / "suite" / "notes.txt"
    notes.parent.mkdir(parents=True)
    notes.write_text("mine")
    with pytest.raises(ConfigError, match="is not a suite root fence-audit staged") as info:
        stage_suite(config, source, (), work)
    assert info.value.details["folder"] == str(work / "suite")
    assert "move it away" in info.value.details["next"]
    assert notes.read_text() == "mine"
    notes.unlink()
    notes.parent.rmdir()
    first = stage_suite(config, source, (), work)
    (first.root / ".hypothesis").mkdir()  # what the test processes leave in it
    assert stage_suite(config, source, (), work).root == first.root  # its own, rebuilt
    assert names(first.root) == [".fence-audit-suite", "project", "tests"]


def test_a_stale_report_fence_audit_did_not_write_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The results' audited source is absent here, so mutation.json is not rendered, and
    an older run's is removed; a user's is not."""
    reports = tmp_path / "reports"
    assert run("report", tmp_path, reports) == ExitCode.OK
    mine = reports / "mutation.json"
    mine.write_text("my own Stryker report")
    capsys.readouterr()
    assert run("report", tmp_path, reports) == ExitCode.USAGE
    assert f"did not write (folder: {reports}; files: mutation.json)" in one_line(capsys)
    write_reports(load_results(RESULTS), reports)  # called directly: still kept
    assert mine.read_text() == "my own Stryker report"


@pytest.mark.parametrize(
    "manifest",
    [
        "{not json",
        '{"format": 99, "written": []}',
        '{"format": 1, "written": ["../victim.txt"]}',
        '{"format": 1, "written": ["/victim.txt", "regions/notes.txt"]}',
        '{"format": 1, "written": "regions/"}',
    ],
)
def test_a_damaged_manifest_vouches_for_nothing(
    manifest: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "reports"
    assert run("report", tmp_path, reports) == ExitCode.OK
    (reports / MANIFEST).write_text(manifest)
    (reports / "regions" / "notes.txt").write_text("mine")
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert run("report", tmp_path, reports) == ExitCode.USAGE
    assert (
        f"the reports folder's manifest is not one fence-audit can read "
        f"(manifest: {reports / MANIFEST}; error: "
    ) in one_line(capsys)
    assert snapshot(tmp_path) == before


def test_a_regions_folder_turned_into_a_link_is_not_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "reports"
    assert run("report", tmp_path, reports) == ExitCode.OK
    elsewhere = tmp_path / "documents"
    (reports / "regions").rename(elsewhere)
    (reports / "regions").symlink_to(elsewhere)
    before = snapshot(elsewhere)
    capsys.readouterr()
    assert run("report", tmp_path, reports) == ExitCode.USAGE
    assert "regions in the reports folder is a symbolic link" in one_line(capsys)
    assert snapshot(elsewhere) == before


@pytest.mark.parametrize("name", [".work", "logs", "logs/baseline.log", "audit.json"])
def test_no_write_goes_through_a_link_in_the_reports_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """``reports/.work`` or ``reports/logs`` a link to another folder: mutate wrote
    baseline.coverage and baseline.log there (issue 59). Every path fence-audit writes
    under the reports folder is checked, before anything is written."""
    reports = tmp_path / "reports"
    assert run("report", tmp_path, reports) == ExitCode.OK
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "baseline.log").write_text("mine")
    link = reports / name
    if link.exists():
        link.unlink() if link.is_file() else shutil.rmtree(link)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(elsewhere / "baseline.log" if "." in Path(name).name[1:] else elsewhere)
    before = snapshot(elsewhere)
    capsys.readouterr()
    assert run("report", tmp_path, reports) == ExitCode.USAGE
    assert f"{name} in the reports folder is a symbolic link" in one_line(capsys)
    assert snapshot(elsewhere) == before


def baseline_run(tmp_path: Path) -> BaselineRun:
    """Coverage data of a one-line target, as a baseline leaves it."""
    path = tmp_path / "fence.py"
    path.write_text("x = 1\n")
    data_file = tmp_path / "baseline.coverage"
    data = coverage.CoverageData(basename=str(data_file))
    data.set_context("tests/test_fence.py::test_x")
    data.add_arcs({str(path): {(-1, 1), (1, -1)}})
    data.write()
    target = Target("fence", path, path, sha256_file(path))
    return BaselineRun(target, (), data_file, tmp_path / "baseline.log", 0.0)


def test_a_second_run_on_the_same_reports_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs on one reports folder: the second rebuilt .work/ under the first and
    overwrote the log it names (issue 59). One run holds the folder; the other stops
    before writing anything, and runs once the first has let go."""
    reports = tmp_path / "reports"
    assert run("report", tmp_path, reports) == ExitCode.OK
    held = os.open(reports / LOCK, os.O_RDWR)  # as a run in progress holds it
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        before = snapshot(reports)
        capsys.readouterr()
        assert run("report", tmp_path, reports) == ExitCode.USAGE
        assert "another fence-audit run is writing this reports folder" in one_line(capsys)
        assert snapshot(reports) == before
    finally:
        os.close(held)
    assert run("report", tmp_path, reports) == ExitCode.OK


@pytest.mark.parametrize(
    ("command", "standing", "says"),
    [
        ("report", "summary.md", "summary.md in the reports folder is a folder where"),
        ("coverage", "logs", "logs in the reports folder is a file where"),
    ],
)
def test_something_standing_where_a_report_goes_is_refused_before_the_run(
    command: str, standing: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder where a report file goes, or a file where a folder goes, in a folder
    fence-audit wrote: refused at the start (exit 1), not met after the judging."""
    reports = tmp_path / "reports"
    assert run("report", tmp_path, reports) == ExitCode.OK
    capsys.readouterr()
    manifest = json.loads((reports / MANIFEST).read_text())
    manifest["written"] = sorted({*manifest["written"], "logs/baseline.log"})
    (reports / MANIFEST).write_text(json.dumps(manifest))
    path = reports / standing
    if path.is_file():  # a report file: a folder stands there
        path.unlink()
        path.mkdir()
    else:  # the logs folder: a file stands there
        path.write_text("mine")
    before = snapshot(reports)
    assert run(command, tmp_path, reports) == ExitCode.USAGE
    message = one_line(capsys)
    assert says in message
    assert snapshot(reports) == before
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (errno.ENOSPC, "; next: free space on that device"),
        (errno.EACCES, "; next: make it writable"),
        (errno.EISDIR, "; next: move the folder that stands where the file goes"),
    ],
)
def test_a_write_that_fails_is_one_line_exit_18_and_keeps_the_old_reports(
    error: int,
    says: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No space left, a write refused, a folder met at the last step: each is one line
    with exit 18 naming the path, the reports as they were and no temporary file left."""
    reports = tmp_path / "reports"
    assert run("report", tmp_path, reports) == ExitCode.OK
    capsys.readouterr()
    before = snapshot(reports)

    def refused(fd: int) -> None:
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(files.os, "fsync", refused)
    code = run("report", tmp_path, reports)
    assert code == ExitCode.CANNOT_WRITE
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    assert f"fence-audit: cannot write {reports}" in err
    assert says in err
    assert snapshot(reports) == before
    assert not [p for p in reports.rglob("*") if p.name.endswith(".tmp")]


def test_an_error_fence_audit_cannot_name_is_left_to_the_traceback(tmp_path: Path) -> None:
    """Only the errors a person can mend become exit 18; any other stays a bug (exit 70)."""
    with pytest.raises(OSError, match="Bad file"), files.writing(tmp_path / "x"):
        raise OSError(errno.EBADF, "Bad file descriptor")
    with pytest.raises(CannotWrite, match="No space"), files.writing(tmp_path / "x"):
        raise OSError(errno.ENOSPC, "No space left on device")

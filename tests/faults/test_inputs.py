"""Bad inputs (issue 13, items 5-8): the command line, the configuration, vLLM's sources.

Each case ends in one line saying what is wrong and where, details saying what to do,
the README's exit code, and no traceback; an input is refused before anything runs
(a run starts by looking up the installed vLLM; then come the download and the baseline).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_index import FakeIndex, make_sdist

from audit.cli import main
from audit.core import cache, environment
from audit.core.errors import ConfigError, ExitCode
from audit.results import shards
from audit.setup.config import default_table, load_config
from audit.setup.model import COVERAGE_MAP_FORMAT

# The built-in default release, the installed vLLM, which the fake index serves for the
# sources cases.
VERSION = str(default_table()["vllm-version"])
ARCHIVE = f"vllm-{VERSION}.tar.gz"
UNREACHABLE = "http://127.0.0.1:9/simple"


@pytest.fixture(autouse=True)
def plain_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FENCE_AUDIT_CACHE", "FENCE_AUDIT_INDEX_URL", "FENCE_AUDIT_VLLM_VERSION"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project folder with an empty ``[tool.fence-audit]``: the built-in defaults."""
    folder = tmp_path / "project"
    folder.mkdir()
    write_config(folder, "")
    return folder


@pytest.fixture
def no_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that starts fails the test: the input should have been refused first."""

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started: the bad input was not checked first")

    monkeypatch.setattr(environment, "installed_vllm", started)


def write_config(folder: Path, body: str) -> Path:
    path = folder / "pyproject.toml"
    path.write_text(f"[tool.fence-audit]\n{body}", encoding="utf-8")
    return path


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``fence-audit ARGS`` in this process: its exit code and its stderr."""
    try:
        code = main(list(args))
    except SystemExit as exit_:  # argparse's own exit, before issue 13
        code = exit_.code if isinstance(exit_.code, int) else 1
    return code, capsys.readouterr().err


def assert_refused(outcome: tuple[int, str], code: ExitCode, *phrases: str) -> None:
    """Exit ``code``; no traceback; one line, the audit's, holding every phrase."""
    exit_code, stderr = outcome
    assert "Traceback" not in stderr, stderr
    assert exit_code == code, stderr
    assert stderr.startswith("fence-audit: "), stderr
    assert stderr.count("\n") == 1, stderr
    for phrase in phrases:
        assert phrase in stderr, stderr


# --- the command line: usage errors are exit 1 (2 means the gate failed) -----------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("gate", "--fail-under", "abc"), "argument --fail-under: invalid float value: 'abc'"),
        (("frob",), "argument COMMAND: invalid choice: 'frob'"),
        (("mutate", "-j", "abc"), "argument -j/--jobs: 'abc' is not a whole number"),
        (("gate", "--results"), "argument --results: expected one argument"),
        (
            ("mutate", "--shard", "-1/2"),
            "expected one argument (command: fence-audit mutate); "
            "next: give --shard a value (one that starts with '-' as --shard=VALUE)",
        ),
        (("mutate", "--shard=-1/2"), "argument --shard: "),
        (("catalogue",), "the following arguments are required: action"),
        ((), "the following arguments are required: COMMAND"),
        (("gate", "--bogus"), "gate: unknown argument --bogus; next: `fence-audit gate --help"),
        (("--bogus", "gate"), "unknown argument --bogus before the command"),
    ],
    ids=[
        "not-a-number",
        "unknown-command",
        "jobs-word",
        "missing-value",
        "value-like-an-option",
        "value-after-equals",
        "no-action",
        "none",
        "unknown-option",
        "unknown-option-first",
    ],
)
def test_a_usage_error_is_exit_1_with_what_to_do(
    capsys: pytest.CaptureFixture[str], no_run: None, args: tuple[str, ...], message: str
) -> None:
    assert_refused(cli(capsys, *args), ExitCode.USAGE, message, "--help` lists")


def test_a_usage_error_ends_the_process_with_exit_1(tmp_path: Path) -> None:
    process = subprocess.run(
        [sys.executable, "-m", "audit", "mutate", "-j", "abc"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert_refused((process.returncode, process.stderr), ExitCode.USAGE, "'abc' is not a whole")


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_still_exit_0(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    with pytest.raises(SystemExit) as info:
        main([flag])
    assert info.value.code == 0
    assert "fence-audit" in capsys.readouterr().out


@pytest.mark.parametrize("jobs", ["0", "-1"])
@pytest.mark.parametrize("command", ["mutate", "bench"])
def test_fewer_than_one_worker_is_refused(
    capsys: pytest.CaptureFixture[str], no_run: None, project: Path, command: str, jobs: str
) -> None:
    outcome = cli(capsys, command, "--config", str(project / "pyproject.toml"), "-j", jobs)
    assert_refused(outcome, ExitCode.USAGE, f"argument -j/--jobs: must be at least 1, not {jobs}")


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("mutate", "--region", "flsuh"), "--region"),
        (("bench", "--region", "flsuh"), "--region"),
        (("mutate", "--fail-under-region", "flsuh=90"), "--fail-under-region"),
    ],
    ids=["mutate-region", "bench-region", "gate-option"],
)
def test_an_unknown_region_is_refused_before_the_run(
    capsys: pytest.CaptureFixture[str],
    no_run: None,
    project: Path,
    args: tuple[str, ...],
    option: str,
) -> None:
    outcome = cli(capsys, *args, "--config", str(project / "pyproject.toml"))
    assert_refused(
        outcome,
        ExitCode.USAGE,
        f"{option} names region 'flsuh', which is not configured",
        "regions: population, flush, removal, sliding_window",
    )


def test_an_unknown_region_in_the_configured_gate_is_refused_before_the_run(
    capsys: pytest.CaptureFixture[str], no_run: None, project: Path
) -> None:
    config = write_config(project, "[tool.fence-audit.gate]\nregions = { flsuh = 90 }\n")
    outcome = cli(capsys, "mutate", "--config", str(config))
    assert_refused(outcome, ExitCode.USAGE, "[tool.fence-audit.gate] regions names region")


# --- the configuration ------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "command"),
    [
        ("catalogue", "mutants/catalog", ("catalogue", "check")),
        ("equivalents", "mutants/equivalent.toml", ("regions",)),
    ],
)
def test_a_configured_path_that_does_not_exist_is_an_error(
    capsys: pytest.CaptureFixture[str],
    no_run: None,
    project: Path,
    key: str,
    value: str,
    command: tuple[str, ...],
) -> None:
    config = write_config(project, f'{key} = "{value}"\n')
    outcome = cli(capsys, *command, "--config", str(config))
    assert_refused(
        outcome,
        ExitCode.USAGE,
        f"the {key} {'folder' if key == 'catalogue' else 'file'} {project / value} does not exist",
        f"{key} = '{value}'",
        "remove the key if the project has no",
    )


def test_the_default_catalogue_and_equivalents_may_be_absent(project: Path) -> None:
    config = load_config(project / "pyproject.toml")
    assert config.catalogue_dir == project / "mutants" / "catalogue"
    assert config.equivalents_file == project / "mutants" / "equivalents.toml"
    assert not config.catalogue_dir.exists()
    assert not config.equivalents_file.exists()


def test_config_naming_a_folder_is_an_error(
    capsys: pytest.CaptureFixture[str], no_run: None, project: Path
) -> None:
    outcome = cli(capsys, "regions", "--config", str(project))
    assert_refused(outcome, ExitCode.USAGE, "configuration file is a folder", str(project))


@pytest.mark.parametrize("option", ["--results", "--compare"])
def test_results_naming_a_folder_is_an_error(
    capsys: pytest.CaptureFixture[str], project: Path, option: str
) -> None:
    results = Path(__file__).parents[1] / "unit" / "data" / "results.json"
    args = ["report", "--config", str(project / "pyproject.toml"), "--results", str(results)]
    args += ["--reports", str(project / "reports"), option, str(project)]
    assert_refused(cli(capsys, *args), ExitCode.USAGE, "results file", str(project))


def test_config_that_is_not_utf8_is_an_error(
    capsys: pytest.CaptureFixture[str], no_run: None, project: Path
) -> None:
    config = project / "pyproject.toml"
    config.write_bytes(b'[tool.fence-audit]\nreports = "r\xe9ports"\n')  # Latin-1
    outcome = cli(capsys, "regions", "--config", str(config))
    assert_refused(outcome, ExitCode.USAGE, "configuration file is not UTF-8 text", str(config))


def test_config_whose_tool_table_is_not_a_table_is_an_error(
    capsys: pytest.CaptureFixture[str], no_run: None, project: Path
) -> None:
    config = project / "pyproject.toml"
    config.write_text("tool = 1\n")
    outcome = cli(capsys, "regions", "--config", str(config))
    assert_refused(outcome, ExitCode.USAGE, "[tool] must be a table, not", str(config))


def test_catalogue_entry_that_is_not_utf8_is_an_error(
    capsys: pytest.CaptureFixture[str], project: Path
) -> None:
    entry = project / "mutants" / "catalogue" / "bad.toml"
    entry.parent.mkdir(parents=True)
    entry.write_bytes(b'id = "bad"\nwhy = "caf\xe9"\n')
    outcome = cli(capsys, "catalogue", "check", "--config", str(project / "pyproject.toml"))
    assert_refused(outcome, ExitCode.USAGE, "catalogue entry is not UTF-8 text", str(entry))


@pytest.mark.parametrize(
    ("content", "problem"),
    [(b"# caf\xe9\n", "is not UTF-8 text"), (b"[[equivalent]\n", "is not valid TOML")],
)
def test_equivalents_file_that_cannot_be_read_is_an_error(
    capsys: pytest.CaptureFixture[str], no_run: None, project: Path, content: bytes, problem: str
) -> None:
    equivalents = project / "mutants" / "equivalents.toml"
    equivalents.parent.mkdir(parents=True)
    equivalents.write_bytes(content)
    outcome = cli(capsys, "regions", "--config", str(project / "pyproject.toml"))
    assert_refused(outcome, ExitCode.USAGE, f"the equivalents file {problem}", str(equivalents))


ENTRY = """format = 1
id = "{id}"
region = "flush"
title = "t"
bug = "b"
invariant = "I2"
symptom = "s"
expected = "project"

[[change]]
function = "OffloadingConnectorScheduler._update_req_states"
statement = "for copy in scheduler_output.kv_cache_block_copies or ():"
action = "delete"
"""


@pytest.mark.parametrize("where", ["sub/entry.toml", "ENTRY.TOML"])
def test_a_catalogue_entry_that_would_not_be_read_is_an_error(
    capsys: pytest.CaptureFixture[str], project: Path, where: str
) -> None:
    """An entry in a subfolder, or named *.TOML, was skipped silently (issue 59)."""
    entry = project / "mutants" / "catalogue" / where
    entry.parent.mkdir(parents=True)
    entry.write_text(ENTRY.format(id="entry"))
    outcome = cli(capsys, "catalogue", "check", "--config", str(project / "pyproject.toml"))
    assert_refused(outcome, ExitCode.USAGE, "a catalogue entry would not be read", str(entry))


def test_two_catalogue_entries_with_the_same_change_are_an_error(
    capsys: pytest.CaptureFixture[str], project: Path
) -> None:
    """Both were judged, each a mutant of its own, the same bug twice (issue 59)."""
    folder = project / "mutants" / "catalogue"
    folder.mkdir(parents=True)
    for name in ("one", "two"):
        (folder / f"{name}.toml").write_text(ENTRY.format(id=name))
    outcome = cli(capsys, "catalogue", "check", "--config", str(project / "pyproject.toml"))
    assert_refused(
        outcome, ExitCode.USAGE, "catalogue entries one and two make the same change", "two.toml"
    )


def test_an_equivalent_listed_twice_is_an_error(
    capsys: pytest.CaptureFixture[str], no_run: None, project: Path
) -> None:
    """The reports listed such a verdict twice (issue 59)."""
    equivalents = project / "mutants" / "equivalents.toml"
    equivalents.parent.mkdir(parents=True)
    verdict = (
        '[[equivalent]]\nid = "F.f:swap_op@1:0-1:1#0"\nfunction_sha256 = "ab"\n'
        'reviewed = "r"\nreason = "why"\n\n'
    )
    equivalents.write_text(verdict * 2)
    outcome = cli(capsys, "regions", "--config", str(project / "pyproject.toml"))
    assert_refused(
        outcome, ExitCode.USAGE, "F.f:swap_op@1:0-1:1#0 is listed twice", str(equivalents)
    )


@pytest.mark.parametrize("url", ["notaurl", "http://[::1"])  # an unclosed IPv6 address
def test_an_index_url_that_is_not_a_url_is_an_error(
    capsys: pytest.CaptureFixture[str],
    no_run: None,
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
    url: str,
) -> None:
    monkeypatch.setenv("FENCE_AUDIT_INDEX_URL", url)
    outcome = cli(capsys, "fetch", "--config", str(project / "pyproject.toml"))
    assert_refused(
        outcome,
        ExitCode.USAGE,
        f"the package index URL {url!r} is not an http(s) URL",
        "set by:",
        "$FENCE_AUDIT_INDEX_URL",
    )


@pytest.mark.parametrize("how", ["--cache-dir", "$FENCE_AUDIT_CACHE"])
def test_a_cache_dir_that_is_a_file_is_an_error(
    capsys: pytest.CaptureFixture[str],
    no_run: None,
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    cache = project / "cache"
    cache.write_text("not a folder\n")
    args = ["fetch", "--config", str(project / "pyproject.toml")]
    if how == "--cache-dir":
        args += ["--cache-dir", str(cache)]
    else:
        monkeypatch.setenv("FENCE_AUDIT_CACHE", str(cache))
    outcome = cli(capsys, *args)
    assert_refused(outcome, ExitCode.USAGE, f"the cache folder {cache} is a file", f"set by: {how}")


# --- vLLM's sources: the sdist from a (fake) package index --------------------------


@pytest.fixture
def index(fake_index: Callable[[str], FakeIndex], monkeypatch: pytest.MonkeyPatch) -> FakeIndex:
    started = fake_index(VERSION)
    monkeypatch.setenv("FENCE_AUDIT_INDEX_URL", started.url)
    return started


def serve(index: FakeIndex, *extra: tarfile.TarInfo) -> None:
    """Serve the fake sdist with ``extra`` members after its own, with its sha256."""
    buffer = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(make_sdist(VERSION)), mode="r:gz") as base,
        tarfile.open(fileobj=buffer, mode="w:gz") as tar,
    ):
        for member in base.getmembers():
            tar.addfile(member, base.extractfile(member))
        for member in extra:
            tar.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
    index.sdist = buffer.getvalue()
    index.digest = hashlib.sha256(index.sdist).hexdigest()


def member(name: str, *, link: str = "", kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(f"vllm-{VERSION}/{name}")
    info.type, info.linkname, info.size = kind, link, 0 if link else 1
    return info


def fetch(capsys: pytest.CaptureFixture[str], project: Path) -> tuple[int, str]:
    config = str(project / "pyproject.toml")
    return cli(capsys, "fetch", "--config", config, "--cache-dir", str(project / "cache"))


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (member("tests/../../../evil.txt"), "its path leaves tests/"),
        (member("tests/../vllm/other.py"), "its path leaves tests/"),
        (
            member("tests/init.py", link=f"vllm-{VERSION}/vllm/__init__.py", kind=tarfile.LNKTYPE),
            f"a hard link to vllm-{VERSION}/vllm/__init__.py",
        ),
        (
            member("tests/passwd", link="../../../etc/passwd", kind=tarfile.SYMTYPE),
            "outside the destination",
        ),
    ],
    ids=["path-traversal", "path-out-of-tests", "hardlink-out-of-tests", "symlink-escaping"],
)
def test_a_refused_tar_member_is_exit_9_naming_it(
    capsys: pytest.CaptureFixture[str],
    project: Path,
    index: FakeIndex,
    extra: tarfile.TarInfo,
    why: str,
) -> None:
    serve(index, extra)
    assert_refused(
        fetch(capsys, project),
        ExitCode.SOURCE_INTEGRITY,
        f"{ARCHIVE} holds a member fence-audit refuses to extract: {extra.name}",
        why,
        "nothing was extracted",
    )
    assert not (project / "cache" / "tests").exists() or not any(
        (project / "cache" / "tests").iterdir()
    )


@pytest.mark.vllm
def test_a_hardlink_inside_tests_is_extracted(
    capsys: pytest.CaptureFixture[str], project: Path, index: FakeIndex
) -> None:
    link = f"vllm-{VERSION}/tests/test_x.py"
    serve(index, member("tests/test_copy.py", link=link, kind=tarfile.LNKTYPE))
    code, stderr = fetch(capsys, project)
    assert code == ExitCode.OK, stderr
    tests = project / "cache" / "tests" / f"vllm-{VERSION}" / "tests"
    assert (tests / "test_copy.py").read_text() == (tests / "test_x.py").read_text()


def truncate_cached_archive(project: Path) -> Path:
    archive = project / "cache" / "sdist" / ARCHIVE
    archive.write_bytes(archive.read_bytes()[:100])
    (project / "cache" / "tests" / f"vllm-{VERSION}" / ".fence-audit-complete").unlink()
    return archive


@pytest.mark.vllm
def test_a_truncated_cached_sdist_is_fetched_again(
    capsys: pytest.CaptureFixture[str], project: Path, index: FakeIndex
) -> None:
    assert fetch(capsys, project)[0] == ExitCode.OK
    archive = truncate_cached_archive(project)
    code, stderr = fetch(capsys, project)
    assert code == ExitCode.OK, stderr
    assert archive.read_bytes() == index.sdist
    assert index.requests.count("/files/vllm.tar.gz") == 2


@pytest.mark.vllm
def test_a_truncated_cached_sdist_with_the_index_unreachable_names_the_cache(
    capsys: pytest.CaptureFixture[str],
    project: Path,
    index: FakeIndex,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert fetch(capsys, project)[0] == ExitCode.OK
    truncate_cached_archive(project)
    monkeypatch.setenv("FENCE_AUDIT_INDEX_URL", UNREACHABLE)
    assert_refused(
        fetch(capsys, project),
        ExitCode.SOURCE_INTEGRITY,
        f"the cached {ARCHIVE} does not match the sha256 recorded when it was downloaded",
        f"sha256 from: the cache, {project / 'cache' / 'sdist' / ARCHIVE}.sha256",
        f"expected: {index.digest}",
        "run again when the index is reachable",
    )


@pytest.mark.vllm
def test_a_download_that_does_not_match_names_the_index(
    capsys: pytest.CaptureFixture[str], project: Path, index: FakeIndex
) -> None:
    index.digest = "0" * 64
    assert_refused(
        fetch(capsys, project),
        ExitCode.SOURCE_INTEGRITY,
        f"the download of {ARCHIVE} does not match the sha256 the package index publishes",
        f"sha256 from: the package index, {index.url}",
        "nothing was kept",
    )
    assert not list((project / "cache" / "sdist").iterdir())


def listed(index: FakeIndex, **changes: object) -> bytes:
    """The index's listing with its one file's fields changed."""
    listing = index.listing()
    files = listing["files"]
    assert isinstance(files, list)
    files[0].update(changes)
    return json.dumps(listing).encode()


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("answer", "code", "phrase"),
    [
        (lambda i: listed(i, hashes=["a"]), ExitCode.SOURCE_INTEGRITY, "publishes no sha256"),
        (lambda i: listed(i, hashes={"sha256": 7}), ExitCode.SOURCE_INTEGRITY, "no sha256"),
        (lambda i: b"[" * 100_000, ExitCode.SOURCE_UNAVAILABLE, "did not answer with PEP 691"),
        (
            lambda i: b'{"files": [], "n": 1' + b"0" * 5000 + b"}",
            ExitCode.SOURCE_UNAVAILABLE,
            "did not answer with PEP 691",
        ),
        (
            lambda i: listed(i, url="http://[::1"),
            ExitCode.SOURCE_UNAVAILABLE,
            "a URL that cannot be read",
        ),
    ],
    ids=["hashes-a-list", "sha256-a-number", "nested-past-reading", "5000-digits", "bad-url"],
)
def test_an_index_answer_of_the_wrong_shape_is_one_line(
    capsys: pytest.CaptureFixture[str],
    project: Path,
    index: FakeIndex,
    answer: Callable[[FakeIndex], bytes],
    code: ExitCode,
    phrase: str,
) -> None:
    index.answer = answer(index)
    assert_refused(fetch(capsys, project), code, phrase)


@pytest.mark.vllm
def test_a_cached_digest_that_is_not_text_is_a_cache_miss(
    capsys: pytest.CaptureFixture[str], project: Path, index: FakeIndex
) -> None:
    assert fetch(capsys, project)[0] == ExitCode.OK
    assert cache.marked(project / "cache")  # the run tagged the cache it wrote
    digest = project / "cache" / "sdist" / f"{ARCHIVE}.sha256"
    digest.write_bytes(b"\xff\xfe")
    code, stderr = fetch(capsys, project)
    assert code == ExitCode.OK, stderr
    assert digest.read_text() == index.digest + "\n"
    assert index.requests.count("/files/vllm.tar.gz") == 2


@pytest.mark.vllm
def test_a_folder_where_the_cache_keeps_a_digest_is_refused_and_kept(
    capsys: pytest.CaptureFixture[str], project: Path, index: FakeIndex
) -> None:
    assert fetch(capsys, project)[0] == ExitCode.OK  # a cache fence-audit made
    digest = project / "cache" / "sdist" / f"{ARCHIVE}.sha256"
    digest.unlink()
    (project / "cache" / "tests" / f"vllm-{VERSION}" / ".fence-audit-complete").unlink()
    mine = digest / "notes.txt"
    mine.parent.mkdir()
    mine.write_text("mine")
    assert_refused(
        fetch(capsys, project), ExitCode.USAGE, f"where fence-audit keeps {ARCHIVE}.sha256"
    )
    assert mine.read_text() == "mine"


def test_a_symbolic_link_loop_is_one_line(
    capsys: pytest.CaptureFixture[str], project: Path, tmp_path: Path
) -> None:
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    config = str(project / "pyproject.toml")
    loop = str(tmp_path / "loop1")
    for args in (
        ("gate", "--config", loop),
        ("report", "--config", config, "--reports", loop),
        ("cache", "--config", config, "--cache-dir", loop),
        ("gate", "--config", config, "--results", loop),
        ("merge", "--config", config, loop),
        ("regions", "--config", config, "--vllm-src", loop),
    ):
        assert_refused(cli(capsys, *args), ExitCode.USAGE, "a symbolic link loop")


def test_a_named_pipe_is_refused_not_waited_on(
    capsys: pytest.CaptureFixture[str], project: Path, tmp_path: Path
) -> None:
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    config = str(project / "pyproject.toml")
    assert_refused(
        cli(capsys, "gate", "--config", config, "--results", str(pipe)),
        ExitCode.USAGE,
        "not a regular file",
    )
    assert_refused(cli(capsys, "gate", "--config", str(pipe)), ExitCode.USAGE, "not a regular")


def test_numbers_past_reading_are_one_line(
    capsys: pytest.CaptureFixture[str], project: Path, tmp_path: Path
) -> None:
    """5,000 digits stop Python's int parser; 400 would overflow a float."""
    config = str(project / "pyproject.toml")
    results = tmp_path / "audit.json"
    results.write_text('{"format": 1' + "0" * 5000 + "}")
    assert_refused(
        cli(capsys, "gate", "--config", config, "--results", str(results)),
        ExitCode.USAGE,
        "not valid JSON",
        "Exceeds the limit",
    )
    huge = write_config(tmp_path, "[tool.fence-audit.gate]\nfail-under = 1" + "0" * 5000 + "\n")
    assert_refused(
        cli(capsys, "gate", "--config", str(huge), "--results", str(results)),
        ExitCode.USAGE,
        "beyond what can be read",
    )
    costs = tmp_path / "coverage-map.json"
    for duration, refused in (
        ("1e308", "from 0 to 1,000,000,000"),
        ("1" + "0" * 400, "401 digits"),
    ):
        costs.write_text(
            json.dumps(
                {"format": COVERAGE_MAP_FORMAT, "tests": [{"id": "t", "duration_s": 0}]}
            ).replace('"duration_s": 0', f'"duration_s": {duration}')
        )
        with pytest.raises(ConfigError, match=refused):
            shards.read_costs(costs)


@pytest.mark.parametrize(
    "text", [" 1/2", "\uff11/\uff12", "1_0/2_0", "1/1001", "1/99999999999999999999"]
)
def test_a_shard_is_ascii_digits_and_at_most_a_thousand(
    capsys: pytest.CaptureFixture[str], project: Path, text: str
) -> None:
    config = str(project / "pyproject.toml")
    assert_refused(
        cli(capsys, "mutate", "--config", config, f"--shard={text}"), ExitCode.USAGE, "--shard"
    )


def test_a_named_config_without_the_table_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file named by --config whose table is misspelt is not the defaults: the gate
    would pass what the intended configuration fails (issue 59)."""
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.fence_audit.gate]\nfail-under = 99\n")
    assert main(["gate", "--config", str(config), "--results", str(tmp_path / "a.json")]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "has no [tool.fence-audit] table ([tool.fence_audit] is not it)" in error
    assert "next: name the table [tool.fence-audit]" in error


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"def f(:\n    pass\n", "the audited file does not parse (line 1:"),
        (b"# caf\xe9\n", "the audited file is not UTF-8 text (byte 5)"),
    ],
)
def test_a_checkout_whose_target_is_not_python_is_an_error(
    capsys: pytest.CaptureFixture[str], project: Path, content: bytes, problem: str
) -> None:
    """A realistic pull request: the audited file does not parse, or is not UTF-8; it
    ended in a traceback (issue 59)."""
    checkout = project / "vllm-checkout"
    (checkout / "tests").mkdir(parents=True)
    target = checkout / "vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py"
    target.parent.mkdir(parents=True)
    target.write_bytes(content)
    config = str(project / "pyproject.toml")
    outcome = cli(capsys, "regions", "--config", config, "--vllm-src", str(checkout))
    assert_refused(outcome, ExitCode.USAGE, problem, str(target))

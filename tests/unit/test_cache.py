"""The cache folder: its entries by kind, the stamp a run leaves on what it uses, and
pruning, which removes only fence-audit's entries that no run used for the days given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from audit.baseline.cache import BaselineCache, key_of
from audit.cli import main
from audit.core import cache
from audit.core.errors import ConfigError
from audit.core.inputs import check_cache_dir
from audit.core.protocol import MutantStatus, Verdict, save_verdict
from audit.judging.verdict_cache import TestHasher, VerdictCache
from audit.mutation import generation
from audit.setup.sources import MARKER, sdist_module, sdist_tests

NOW = 1_800_000_000.0
KEY = "0123456789abcdef" * 2


def aged(path: Path, days: float, now: float = NOW) -> Path:
    """``path`` last used ``days`` days before ``now``."""
    stamp = now - days * cache.DAY_S
    os.utime(path, (stamp, stamp))
    return path


def write(path: Path, text: str = "{}") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def folder(path: Path, *files: str) -> Path:
    for name in files:
        write(path / name, "x" * 10)
    return path


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    """A cache holding one entry of each kind, a leftover, a home, and three foreign
    paths, all used 40 days ago but the fresh verdict."""
    root = tmp_path / "cache"
    cache.mark(root)  # a run has used it
    entries = [
        write(root / "results" / f"{KEY}.json"),
        write(root / "mutations" / f"{KEY}.json"),
        folder(root / "baselines" / KEY, "outcomes.json", "baseline.coverage"),
        write(root / "baselines" / "last-0123456789abcdef.json"),
        write(root / "sdist" / "vllm-0.33.0.tar.gz", "a" * 100),
        write(root / "sdist" / "vllm-0.33.0.tar.gz.sha256", "b" * 65),
        write(root / "sdist" / "vllm-0.32.0.tar.gz.sha256", "c" * 65),  # its archive gone
        folder(root / "tests" / "vllm-0.33.0", "conftest.py", MARKER),
        folder(root / "modules" / "vllm-0.32.0", "vllm/scheduler.py"),
        write(root / "results" / f".{KEY}.4242.tmp"),
        write(root / "sdist" / ".vllm-0.33.0.tar.gz.x1y_2.part"),
        folder(root / "baselines" / f".{KEY}.part-abc_12", "baseline.log"),
        folder(root / "hf-home", "hub/x"),
        write(root / "results" / "notes.txt", "mine"),
        write(root / "mine.txt", "mine"),
        folder(root / "elsewhere", "a"),
    ]
    for path in entries:
        aged(path, 40)
    aged(write(root / "results" / f"{'f' * 32}.json"), 1)
    return root


def test_the_entries_are_listed_by_kind_and_the_rest_is_foreign(filled: Path) -> None:
    held = cache.contents(filled)
    kinds = sorted((e.kind, str(e.path.relative_to(filled))) for e in held.entries)
    assert kinds == [
        ("baselines", f"baselines/{KEY}"),
        ("baselines", "baselines/last-0123456789abcdef.json"),
        ("leftovers", f"baselines/.{KEY}.part-abc_12"),
        ("leftovers", f"results/.{KEY}.4242.tmp"),
        ("leftovers", "sdist/.vllm-0.33.0.tar.gz.x1y_2.part"),
        ("modules", "modules/vllm-0.32.0"),
        ("mutations", f"mutations/{KEY}.json"),
        ("sdists", "sdist/vllm-0.32.0.tar.gz.sha256"),
        ("sdists", "sdist/vllm-0.33.0.tar.gz"),
        ("tests", "tests/vllm-0.33.0"),
        ("verdicts", f"results/{KEY}.json"),
        ("verdicts", f"results/{'f' * 32}.json"),
    ]
    sdist = next(e for e in held.entries if e.path.name == "vllm-0.33.0.tar.gz")
    assert sdist.size == 165  # with its digest
    assert sorted(str(p.relative_to(filled)) for p in held.foreign) == [
        "elsewhere",
        "mine.txt",
        "results/notes.txt",
    ]
    table = cache.format_contents(held.entries)
    assert table.splitlines()[1].split()[:2] == ["verdicts", "2"]
    assert table.splitlines()[-1].split()[0] == "leftovers"


def test_prune_removes_the_entries_unused_for_the_days_and_nothing_else(filled: Path) -> None:
    removed = cache.prune(filled, 30, now=NOW)
    assert len(removed) == 11
    left = sorted(str(p.relative_to(filled)) for p in filled.rglob("*"))
    assert left == [
        ".fence-audit.lock",  # the runs' and the prunes' lock: kept
        "CACHEDIR.TAG",
        "baselines",
        "elsewhere",
        "elsewhere/a",
        "hf-home",
        "hf-home/hub",
        "hf-home/hub/x",
        "mine.txt",
        "modules",
        "mutations",
        "results",
        f"results/{'f' * 32}.json",  # used a day ago
        "results/notes.txt",
        "sdist",  # the archive and its digest went together
        "tests",
    ]


def test_prune_keeps_what_was_used_within_the_days(filled: Path) -> None:
    assert cache.prune(filled, 41, now=NOW) == ()
    assert [e.kind for e in cache.prune(filled, 2, now=NOW)].count("verdicts") == 1


def test_prune_can_keep_to_some_kinds(filled: Path) -> None:
    removed = cache.prune(filled, 30, now=NOW, kinds=("verdicts", "leftovers"))
    assert sorted(e.kind for e in removed) == ["leftovers"] * 3 + ["verdicts"]
    assert (filled / "sdist" / "vllm-0.33.0.tar.gz").is_file()


def test_a_size_budget_removes_the_least_recently_used_first(filled: Path) -> None:
    # Every entry 40 days old but the fresh verdict (2 bytes); the sdist, the largest,
    # 10 days old.
    sizes = {e.path.name: e.size for e in cache.contents(filled).entries}
    aged(filled / "sdist" / "vllm-0.33.0.tar.gz", 10)  # used more lately than the rest
    total = sum(sizes.values())
    removed = cache.prune(filled, max_bytes=sizes["vllm-0.33.0.tar.gz"] + 2, now=NOW)
    assert [e.path.name for e in removed][-1] != "vllm-0.33.0.tar.gz"
    left = {e.path.name: e.size for e in cache.contents(filled).entries}
    assert set(left) == {"vllm-0.33.0.tar.gz", f"{'f' * 32}.json"}
    assert sum(left.values()) <= sizes["vllm-0.33.0.tar.gz"] + 2 < total
    assert cache.prune(filled, max_bytes=10**6, now=NOW) == ()


def test_prune_keeps_an_entry_used_after_the_listing(
    filled: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that uses an entry while the prune runs keeps it: its time is read again
    just before it would go."""
    for entry in cache.contents(filled).entries:
        aged(entry.path, 40, now=time.time())
    listed = cache.contents(filled)
    cache.used(filled / "results" / f"{KEY}.json")
    monkeypatch.setattr(cache, "contents", lambda root: listed)
    removed = cache.prune(filled, 30)
    assert len(removed) == len(listed.entries) - 1
    assert (filled / "results" / f"{KEY}.json").is_file()


def test_a_symlink_is_never_followed_nor_removed(tmp_path: Path) -> None:
    outside = folder(tmp_path / "outside", "precious")
    root = tmp_path / "cache"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "vllm-0.33.0").symlink_to(outside)
    (root / "results").symlink_to(outside)
    held = cache.contents(root)
    assert held.entries == ()
    assert len(held.foreign) == 2
    cache.prune(root, 0, now=NOW + 1)
    assert (outside / "precious").is_file()
    assert (root / "tests" / "vllm-0.33.0").is_symlink()


def test_an_empty_or_missing_cache_has_no_entries(tmp_path: Path) -> None:
    assert cache.contents(tmp_path / "none") == cache.Contents((), ())
    assert cache.prune(tmp_path / "none", 0) == ()


# --- what a run reads, it stamps ----------------------------------------------------


def stale(path: Path) -> float:
    aged(path, 40, now=time.time())
    return path.stat().st_mtime


def test_a_verdict_read_from_the_cache_is_stamped(tmp_path: Path) -> None:
    verdicts = VerdictCache(tmp_path / "results", TestHasher(tmp_path), "0.33.0")
    save_verdict(verdicts.path(KEY), Verdict(MutantStatus.KILLED, killed_by="t"))
    before = stale(verdicts.path(KEY))
    assert verdicts.lookup("m", KEY) is not None
    assert verdicts.path(KEY).stat().st_mtime > before + 30 * cache.DAY_S


def test_a_function_s_mutations_read_from_the_cache_are_stamped(tmp_path: Path) -> None:
    source = "def f(a):\n    return a + 1\n"
    made = generation.generate_cached(source, ["f"], tmp_path)
    (path,) = tmp_path.glob("*.json")
    before = stale(path)
    assert generation.generate_cached(source, ["f"], tmp_path) == made
    assert path.stat().st_mtime > before + 30 * cache.DAY_S


def test_a_baseline_read_from_the_cache_is_stamped_with_its_selection(tmp_path: Path) -> None:
    baselines = BaselineCache(tmp_path)
    inputs = {"selection": "tests/test_x.py", "source": "abc"}
    entry = folder(tmp_path / key_of(inputs), "baseline.coverage", "baseline.log")
    write(entry / "outcomes.json", json.dumps(
        {"inputs": inputs, "exit_code": 0, "duration_s": 1.0, "tests": []}
    ))  # fmt: skip
    last = write(baselines._last(inputs), json.dumps(inputs))
    before = [stale(entry), stale(last)]
    assert baselines.load(inputs) is not None
    after = [entry.stat().st_mtime, last.stat().st_mtime]
    assert all(a > b + 30 * cache.DAY_S for a, b in zip(after, before, strict=True))


def test_a_release_s_cached_tests_and_sdist_are_stamped(tmp_path: Path) -> None:
    digest = "c" * 64
    tree = folder(tmp_path / "tests" / "vllm-0.33.0", "conftest.py")
    write(tree / MARKER, digest + "\n")
    archive = write(tmp_path / "sdist" / "vllm-0.33.0.tar.gz")
    sha = write(tmp_path / "sdist" / "vllm-0.33.0.tar.gz.sha256", digest + "\n")
    before = [stale(tree), stale(archive), stale(sha)]
    sdist_tests("0.33.0", index_url="http://127.0.0.1:9/simple", cache_dir=tmp_path)
    after = [p.stat().st_mtime for p in (tree, archive, sha)]
    assert all(a > b + 30 * cache.DAY_S for a, b in zip(after, before, strict=True))


# --- the command ----------------------------------------------------------------------


def fence_audit(tmp_path: Path, *args: str) -> int:
    # the built-in configuration
    config = write(tmp_path / "pyproject.toml", "[tool.fence-audit]\n")
    return main(["cache", "--config", str(config), *args])


def test_the_command_prunes_then_lists_and_names_what_it_left(
    filled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for entry in cache.contents(filled).entries:  # as old as the fixture's, but from now
        aged(entry.path, 40 if "f" * 32 not in entry.path.name else 1, now=time.time())
    assert fence_audit(tmp_path, "--cache-dir", str(filled), "--prune", "30") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "fence-audit: pruned 11 entries (no run has used for 30 days): 0.0 MB (baselines 2, "
        "leftovers 3, modules 1, mutations 1, sdists 2, tests 1, verdicts 1)"
    )
    assert out[1] == f"fence-audit: cache {filled}: 1 entry, 0.0 MB"
    assert out[3].split()[:2] == ["kind", "entries"]
    assert out[4].split()[:2] == ["verdicts", "1"]
    assert out[5] == (
        "fence-audit: 3 paths in the cache are not fence-audit's, left as they are: "
        "elsewhere, mine.txt, results/notes.txt"
    )
    assert (filled / "mine.txt").is_file()


def test_the_command_keeps_the_cache_under_a_size(
    filled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fence_audit(tmp_path, "--cache-dir", str(filled), "--prune", "30", "--max-mb", "0") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(
        "fence-audit: pruned 12 entries (no run has used for 30 days or least recently used "
        "beyond 0 MB): 0.0 MB"
    )
    assert out[1] == f"fence-audit: cache {filled}: 0 entries, 0.0 MB"


def test_without_prune_the_command_removes_nothing(
    filled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(filled.rglob("*"))
    assert fence_audit(tmp_path, "--cache-dir", str(filled)) == 0
    assert capsys.readouterr().out.startswith(f"fence-audit: cache {filled}: 12 entries")
    assert sorted(filled.rglob("*")) == before


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--prune", "-1"], "argument --prune: must be at least 0, not -1"),
        (["--prune", "a week"], "argument --prune: 'a week' is not a whole number"),
        (["--max-mb", "1.5"], "argument --max-mb: '1.5' is not a whole number"),
        (["--prune", "1" + "0" * 400], "argument --prune: must be at most 1,000,000,000, not 1"),
        (["--cache-dir", "FILE"], "the cache folder FILE is a file"),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_1(
    filled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    a_file = write(tmp_path / "a-file", "")
    args = [str(a_file) if a == "FILE" else a for a in args]
    before = sorted(filled.rglob("*"))
    assert fence_audit(tmp_path, "--cache-dir", str(filled), *args) == 1
    err = capsys.readouterr().err
    assert err.startswith("fence-audit: "), err
    assert "Traceback" not in err
    assert err.count("\n") == 1, err
    assert said.replace("FILE", str(a_file)) in err, err
    assert sorted(filled.rglob("*")) == before


def test_a_release_s_cached_module_is_stamped_with_its_sdist(tmp_path: Path) -> None:
    """The module is read by way of the sdist's digest: the archive, which the digest
    goes with, is stamped too, so neither goes while the module is in use."""
    digest = "d" * 64
    module = "vllm.x.scheduler"
    release = tmp_path / "modules" / "vllm-0.32.0"
    kept = write(release / "vllm" / "x" / "scheduler.py", "x = 1\n")
    write(kept.with_name("scheduler.py.sha256"), digest + "\n")
    archive = write(tmp_path / "sdist" / "vllm-0.32.0.tar.gz")
    sha = write(tmp_path / "sdist" / "vllm-0.32.0.tar.gz.sha256", digest + "\n")
    before = [stale(release), stale(archive), stale(sha)]
    text = sdist_module("0.32.0", module, index_url="http://127.0.0.1:9/simple", cache_dir=tmp_path)
    assert text == "x = 1\n"
    after = [p.stat().st_mtime for p in (release, archive, sha)]
    assert all(a > b + 30 * cache.DAY_S for a, b in zip(after, before, strict=True))


def test_a_baseline_run_again_says_whether_its_source_moved_or_changed(tmp_path: Path) -> None:
    baselines = BaselineCache(tmp_path)
    last = {"selection": "[]", "audited source": "/a/scheduler.py sha256 " + "1" * 64}
    tmp_path.joinpath(baselines._last(last).name).write_text(json.dumps(last))
    moved = {**last, "audited source": "/b/scheduler.py sha256 " + "1" * 64}
    edited = {**last, "audited source": "/a/scheduler.py sha256 " + "2" * 64}
    assert baselines.changed_since_last(moved) == [
        "audited source moved (same sha256), was /a/scheduler.py"
    ]
    assert baselines.changed_since_last(edited) == [
        "audited source changed (sha256 111111111111 before, 222222222222 now)"
    ]


# --- the cache tag --------------------------------------------------------------------


def test_the_tag_follows_the_cache_directory_tagging_spec(tmp_path: Path) -> None:
    root = tmp_path / "new" / "cache"
    assert not cache.marked(root)
    cache.mark(root)
    assert cache.marked(root)
    text = (root / cache.TAG).read_text()
    assert text.startswith("Signature: 8a477f597d28d172789f06886806bc55\n")
    assert cache.contents(root) == cache.Contents((), ())  # the tag is neither entry nor foreign


def test_nothing_is_pruned_from_a_folder_without_the_tag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A project's folder given as the cache by mistake: its tests/vllm-helpers looks
    like a release's tests, and an empty --cache-dir would have been the current folder."""
    project = tmp_path / "project"
    mine = write(project / "tests" / "vllm-helpers" / "test_x.py", "code")
    aged(mine.parent, 40, now=time.time())
    with pytest.raises(ConfigError, match=r"has no CACHEDIR\.TAG"):
        cache.prune(project, 0)
    assert fence_audit(tmp_path, "--cache-dir", str(project), "--prune", "0") == 1
    assert "nothing there is pruned" in capsys.readouterr().err
    assert fence_audit(tmp_path, "--cache-dir", "", "--prune", "0") == 1
    assert "an empty path" in capsys.readouterr().err
    assert mine.read_text() == "code"
    assert cache.prune(tmp_path / "none", 0) == ()  # nothing there, nothing to refuse


def test_a_run_may_tag_its_cache_but_refuses_a_folder_holding_what_is_not_fence_audit_s(
    filled: Path, tmp_path: Path
) -> None:
    (filled / cache.TAG).unlink()  # a cache from before the tag: everything there is ours
    for foreign in cache.contents(filled).foreign:
        if foreign.is_dir():
            foreign.rename(tmp_path / "moved-away")
        else:
            foreign.unlink()
    check_cache_dir(filled, "a test")  # a check: it writes nothing
    assert not cache.marked(filled)
    project = tmp_path / "project"
    write(project / "README.md", "mine")
    with pytest.raises(ConfigError, match=r"holds files fence-audit did not write \(README\.md\)"):
        check_cache_dir(project, "a test")
    assert not cache.marked(project)
    check_cache_dir(project, "a test", claim=False)  # `fence-audit cache` only lists
    check_cache_dir(tmp_path / "fresh", "a test")
    assert not (tmp_path / "fresh").exists()


def _held_elsewhere(root: Path, how: str) -> subprocess.Popen[str]:
    """Another process holding the cache's lock (``SH``, as a run; ``EX``, as a prune)
    until its stdin closes."""
    code = (
        "import fcntl, os, sys; "
        f"fd = os.open({str(root / cache.LOCK)!r}, os.O_RDWR | os.O_CREAT); "
        f"fcntl.flock(fd, fcntl.LOCK_{how}); print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_prune_stops_while_a_run_uses_the_cache(filled: Path) -> None:
    cache.release(filled)  # the fixture's own hold, as a finished run lets go
    holder = _held_elsewhere(filled, "SH")
    try:
        with pytest.raises(ConfigError, match="a fence-audit run is using this cache"):
            cache.prune(filled, 30, now=NOW)
        assert (filled / "results" / f"{KEY}.json").exists()  # nothing removed
    finally:
        holder.communicate("")
    assert cache.prune(filled, 30, now=NOW)  # once the run is over
    cache.release(filled)


def test_a_run_stops_while_the_cache_is_pruned(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    holder = _held_elsewhere(root, "EX")
    try:
        with pytest.raises(ConfigError, match="this cache is being pruned"):
            cache.mark(root)
    finally:
        holder.communicate("")
    cache.mark(root)
    cache.release(root)


def test_a_run_that_prunes_goes_back_to_sharing_the_cache(filled: Path) -> None:
    """The fixture's run holds the cache; its prune holds it alone only while it prunes."""
    assert cache.prune(filled, 30, now=NOW)
    other = _held_elsewhere(filled, "SH")  # another run starts: not refused
    other.communicate("")
    holder = _held_elsewhere(filled, "SH")
    try:
        with pytest.raises(ConfigError, match="a fence-audit run is using this cache"):
            cache.prune(filled, 0, now=NOW + cache.DAY_S)
    finally:
        holder.communicate("")
    cache.release(filled)

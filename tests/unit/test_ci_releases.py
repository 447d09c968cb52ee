"""Which releases the fence-audit workflow audits (.github/scripts/releases.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from fake_index import FakeIndex

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / ".github" / "scripts" / "releases.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ci_releases", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


releases = load_script()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with three locks, the recipe beside them, 0.33.0 configured."""
    locks = tmp_path / "locks"
    locks.mkdir()
    for name in ["vllm-0.33.0.txt", "vllm-0.9.0.txt", "vllm-0.28.0.txt", "vllm.in", "recipe.py"]:
        (locks / name).write_text("")
    (locks / "vllm-0.33.0.in").write_text("")  # an old per-release recipe: not a lock
    (tmp_path / "pyproject.toml").write_text('[tool.fence-audit]\nvllm-version = "0.33.0"\n')
    return tmp_path


def run(repo: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = releases.main(list(args), root=repo)
    out, err = capsys.readouterr()
    return code, out, err


def test_every_lock_is_a_release_oldest_first(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(repo, capsys)
    assert code == 0
    assert json.loads(out) == ["0.9.0", "0.28.0", "0.33.0"]


def test_releases_named_by_hand_are_audited_alone(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(repo, capsys, "--only", " 0.33.0, 0.9.0 ")
    assert (code, json.loads(out)) == (0, ["0.9.0", "0.33.0"])


def test_a_release_without_a_lock_is_refused_with_the_command_that_writes_it(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(repo, capsys, "--only", "0.33.0 0.34.0")
    assert (code, out) == (1, "")
    assert "no lock for vLLM 0.34.0" in err
    assert "nox -s lock -- VERSION" in err


def test_a_pull_request_audits_the_configured_release_and_the_locks_it_changes(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    changed = repo / "changed.txt"
    changed.write_text("audit/cli.py\nlocks/vllm-0.9.0.txt\nlocks/vllm.in\ndocs/vllm-0.28.0.txt\n")
    code, out, _ = run(repo, capsys, "--pull-request", str(changed))
    assert (code, json.loads(out)) == (0, ["0.9.0", "0.33.0"])


def test_a_pull_request_touching_no_lock_audits_the_configured_release(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    changed = repo / "changed.txt"
    changed.write_text("audit/cli.py\n")
    code, out, _ = run(repo, capsys, "--pull-request", str(changed))
    assert (code, json.loads(out)) == (0, ["0.33.0"])


def test_no_lock_at_all_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "locks").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.fence-audit]\nvllm-version = "0.33.0"\n')
    code, _, err = run(tmp_path, capsys)
    assert code == 1
    assert "no lock in locks/" in err


def test_versions_sort_as_numbers() -> None:
    assert sorted(["0.10.0", "0.9.1", "0.33.0", "0.9.0"], key=releases.version_key) == [
        "0.9.0",
        "0.9.1",
        "0.10.0",
        "0.33.0",
    ]


def test_this_repository_audits_its_configured_release(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(ROOT, capsys)
    listed = json.loads(out)
    assert code == 0
    assert releases.configured(ROOT / "pyproject.toml") in listed
    assert listed == sorted(listed, key=releases.version_key)
    assert all((ROOT / "locks" / f"vllm-{v}.txt").is_file() for v in listed)


@pytest.mark.parametrize(("given", "shards"), [("", [1]), ("1", [1]), (" 4 ", [1, 2, 3, 4])])
def test_a_release_is_dealt_over_the_shards_asked_for(
    repo: Path, capsys: pytest.CaptureFixture[str], given: str, shards: list[int]
) -> None:
    code, out, _ = run(repo, capsys, "--shards", given)
    assert (code, json.loads(out)) == (0, shards)


@pytest.mark.parametrize("given", ["0", "17", "two", "-1", "2.5"])
def test_shards_that_are_not_1_to_16_are_refused(
    repo: Path, capsys: pytest.CaptureFixture[str], given: str
) -> None:
    code, out, err = run(repo, capsys, "--shards", given)
    assert (code, out) == (1, "")
    assert "shards must be a whole number from 1 to 16" in err


def test_the_weekly_run_finds_the_releases_newer_than_the_newest_lock(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fake index lists a made-up release 0.99.0 (its sdist and a wheel), a release
    candidate and older releases: only 0.99.0 is new (locks: 0.9.0, 0.28.0, 0.33.0)."""
    index = FakeIndex("0.33.0")
    files = [
        "vllm-0.28.0.tar.gz",
        "vllm-0.33.0.tar.gz",
        "vllm-0.33.0-cp38-abi3-manylinux1_x86_64.whl",
        "vllm-0.99.0-cp38-abi3-manylinux1_x86_64.whl",
        "vllm-0.99.0.tar.gz",
        "vllm-1.0.0rc1.tar.gz",
        "vllm-0.99.0.dev3.tar.gz",
    ]
    index.answer = json.dumps({"files": [{"filename": name} for name in files]}).encode()
    try:
        assert run(repo, capsys, "--newer", "--index", index.url) == (0, '["0.99.0"]\n', "")
        # PEP 700's list of versions, where the index gives one
        index.answer = json.dumps({"versions": ["0.33.0", "0.34.0", "0.35.0rc2"]}).encode()
        assert run(repo, capsys, "--newer", "--index", index.url) == (0, '["0.34.0"]\n', "")
        index.answer = json.dumps({"versions": ["0.32.0", "0.33.0"]}).encode()
        assert run(repo, capsys, "--newer", "--index", index.url) == (0, "[]\n", "")
        index.answer = b"<html>not the JSON API</html>"
        code, out, err = run(repo, capsys, "--newer", "--index", index.url)
        assert (code, out) == (1, "")
        assert "did not answer with PEP 691 JSON" in err
    finally:
        index.close()


def test_an_unreachable_index_is_one_line(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(repo, capsys, "--newer", "--index", "http://127.0.0.1:9/simple")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1
    assert "the new releases cannot be looked up" in err

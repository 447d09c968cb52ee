"""The sdist fetch against a local package index: cache, hashes, offline errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fake_index import FakeIndex

from audit.core.errors import ConfigError, ExitCode, SourceIntegrityError, SourceUnavailable
from audit.setup.sources import checkout_source, sdist_tests

VERSION = "9.9.9"


@pytest.fixture
def index(fake_index: Callable[[str], FakeIndex]) -> FakeIndex:
    return fake_index(VERSION)


def test_sdist_tests_are_extracted_and_nothing_else(index: FakeIndex, tmp_path: Path) -> None:
    source = sdist_tests(VERSION, index_url=index.url, cache_dir=tmp_path)
    assert (source.root / "tests" / "test_x.py").is_file()
    assert not (source.root / "vllm").exists()
    assert source.target_file("vllm.x") is None


def test_second_run_downloads_nothing(index: FakeIndex, tmp_path: Path) -> None:
    sdist_tests(VERSION, index_url=index.url, cache_dir=tmp_path)
    assert len(index.requests) == 2
    again = sdist_tests(VERSION, index_url="http://127.0.0.1:9/unreachable", cache_dir=tmp_path)
    assert len(index.requests) == 2
    assert "cached" in again.origin


def test_the_tests_are_the_same_fetched_or_cached(index: FakeIndex, tmp_path: Path) -> None:
    """The baseline is keyed by what the tests are: a run after the one that fetched
    the sdist reads it from the cache and must find its baseline kept."""
    fetched = sdist_tests(VERSION, index_url=index.url, cache_dir=tmp_path)
    cached = sdist_tests(VERSION, index_url=index.url, cache_dir=tmp_path)
    assert fetched.origin != cached.origin  # what the run prints says where they came from
    assert fetched.identity == cached.identity
    assert fetched.identity.startswith(f"sdist vllm-{VERSION}.tar.gz sha256 ")


def test_cached_archive_is_reextracted_without_network(index: FakeIndex, tmp_path: Path) -> None:
    source = sdist_tests(VERSION, index_url=index.url, cache_dir=tmp_path)
    (source.root / ".fence-audit-complete").unlink()
    sdist_tests(VERSION, index_url="http://127.0.0.1:9/unreachable", cache_dir=tmp_path)
    assert (source.root / "tests" / "test_x.py").is_file()
    assert len(index.requests) == 2


def test_hash_mismatch_stops_and_keeps_nothing(index: FakeIndex, tmp_path: Path) -> None:
    index.digest = "0" * 64
    with pytest.raises(SourceIntegrityError) as info:
        sdist_tests(VERSION, index_url=index.url, cache_dir=tmp_path)
    assert info.value.exit_code == ExitCode.SOURCE_INTEGRITY
    assert info.value.details["expected"] == "0" * 64
    assert not list((tmp_path / "sdist").glob("*.tar.gz*"))
    assert not (tmp_path / "tests").exists()


def test_tampered_cached_archive_is_fetched_again(index: FakeIndex, tmp_path: Path) -> None:
    source = sdist_tests(VERSION, index_url=index.url, cache_dir=tmp_path)
    (source.root / ".fence-audit-complete").unlink()
    archive = tmp_path / "sdist" / f"vllm-{VERSION}.tar.gz"
    archive.write_bytes(archive.read_bytes() + b"x")
    sdist_tests(VERSION, index_url=index.url, cache_dir=tmp_path)
    assert archive.read_bytes() == index.sdist
    assert (source.root / "tests" / "test_x.py").is_file()


def test_tampered_cached_archive_without_the_index_is_detected(
    index: FakeIndex, tmp_path: Path
) -> None:
    source = sdist_tests(VERSION, index_url=index.url, cache_dir=tmp_path)
    (source.root / ".fence-audit-complete").unlink()
    archive = tmp_path / "sdist" / f"vllm-{VERSION}.tar.gz"
    archive.write_bytes(archive.read_bytes() + b"x")
    with pytest.raises(SourceIntegrityError) as info:
        sdist_tests(VERSION, index_url="http://127.0.0.1:9/simple", cache_dir=tmp_path)
    assert info.value.details["sha256 from"].startswith("the cache, ")
    assert info.value.details["expected"] == index.digest


def test_a_relative_file_url_is_read_against_the_index_page(
    index: FakeIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listing = index.listing()
    listing["files"][0]["url"] = "../../files/vllm.tar.gz"  # type: ignore[index]
    monkeypatch.setattr(index, "listing", lambda: listing)
    source = sdist_tests(VERSION, index_url=index.url, cache_dir=tmp_path)
    assert (source.root / "tests" / "test_x.py").is_file()


def test_no_cache_and_no_network_is_source_unavailable(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable) as info:
        sdist_tests(VERSION, index_url="http://127.0.0.1:9/simple", cache_dir=tmp_path)
    assert info.value.exit_code == ExitCode.SOURCE_UNAVAILABLE
    assert "--vllm-src" in info.value.details["next"]


def test_a_version_the_index_does_not_list_is_a_usage_error_naming_who_chose_it(
    index: FakeIndex, tmp_path: Path
) -> None:
    """The index answered: not exit 8 (unreachable), but the version given is wrong."""
    with pytest.raises(ConfigError, match="not on the package index") as info:
        sdist_tests("1.0.0", index_url=index.url, cache_dir=tmp_path, version_from="--release")
    assert info.value.exit_code == ExitCode.USAGE
    assert info.value.details["next"] == "check --release"


def test_a_checkout_that_is_not_a_folder_is_named_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        checkout_source(tmp_path / "nowhere", "vllm.a.b")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is a file"):
        checkout_source(tmp_path / "file", "vllm.a.b")


def test_checkout_must_hold_tests_and_the_target(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    with pytest.raises(ConfigError, match="not a vLLM checkout"):
        checkout_source(tmp_path, "vllm.a.b")
    (tmp_path / "vllm" / "a").mkdir(parents=True)
    (tmp_path / "vllm" / "a" / "b.py").write_text("")
    source = checkout_source(tmp_path, "vllm.a.b")
    assert source.target_file("vllm.a.b") == tmp_path / "vllm" / "a" / "b.py"

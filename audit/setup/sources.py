"""vLLM's own tests for the audited version, and the source file that is audited.

Default: the sdist of exactly the installed version, found on the package index by
name and version (PEP 691 JSON simple API), checked against the sha256 the index
publishes, cached, and only its ``tests/`` folder extracted. A second run finds the
extracted tree in the cache and touches no network.

With ``--vllm-src PATH`` (a local vLLM checkout) the tests *and* the audited target
module come from the checkout; the rest of vLLM is the installed package (see
docs/design/set-up.md, "Auditing a checkout").
"""

from __future__ import annotations

import ast
import json
import os
import posixpath
import re
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from audit.core import cache
from audit.core.environment import module_relpath, sha256_file
from audit.core.errors import ConfigError, SourceIntegrityError, SourceUnavailable
from audit.core.files import replaced_dir, write_text
from audit.core.inputs import brief, resolved

PEP691_JSON = "application/vnd.pypi.simple.v1+json"
MARKER = ".fence-audit-complete"
TIMEOUT_S = 60


@dataclass(frozen=True, slots=True)
class TestSource:
    """A folder that holds vLLM's ``tests/`` package, and where it came from."""

    __test__ = False  # not a pytest test class

    root: Path
    origin: str  # "sdist vllm-0.33.0.tar.gz (sha256 ...)" or "checkout PATH"
    checkout: bool = False
    # what the tests are, the same whether the sdist was fetched now or read from the
    # cache (``origin`` says which): "sdist FILE sha256 DIGEST" or "checkout PATH"
    identity: str = ""

    def target_file(self, module: str) -> Path | None:
        """The checkout's copy of ``module``; None for an sdist (installed code is audited)."""
        return self.root / module_relpath(module) if self.checkout else None


def checkout_source(path: Path, module: str) -> TestSource:
    root = resolved(path, "--vllm-src")
    if not root.is_dir():
        raise ConfigError(
            f"--vllm-src {path} " + ("is a file" if root.exists() else "does not exist"),
            details={"next": "pass the root of a vLLM git checkout (it holds vllm/ and tests/)"},
        )
    missing = [p for p in ("tests", module_relpath(module)) if not (root / p).exists()]
    if missing:
        raise ConfigError(
            f"--vllm-src {path} is not a vLLM checkout: {missing[0]} is missing",
            details={"next": "pass the root of a vLLM git checkout (it holds vllm/ and tests/)"},
        )
    _check_target_parses(root / module_relpath(module), path)
    origin = f"checkout {root}"
    return TestSource(root=root, origin=origin, checkout=True, identity=origin)


def _check_target_parses(target: Path, path: Path) -> None:
    """The checkout's target is Python source the audit can read: a pull request
    that leaves it unparsable is a usage error before anything runs."""
    where = {"file": str(target)}
    try:
        text = target.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"--vllm-src {path}: the audited file is not UTF-8 text (byte {error.start})",
            details={**where, "next": "fix the file's encoding in the checkout"},
        ) from None
    except OSError as error:
        raise ConfigError(
            f"--vllm-src {path}: the audited file cannot be read ({error.strerror})",
            details={**where, "next": "check the file in the checkout"},
        ) from None
    try:
        ast.parse(text, filename=str(target))
    except SyntaxError as error:
        raise ConfigError(
            f"--vllm-src {path}: the audited file does not parse (line {error.lineno}: "
            f"{error.msg})",
            details={**where, "next": "fix the syntax error in the checkout, then run again"},
        ) from None


def sdist_tests(
    version: str, *, index_url: str, cache_dir: Path, version_from: str = "the version"
) -> TestSource:
    """vLLM's ``tests/`` from the sdist of ``version``, from the cache or the index
    (``version_from``: who chose the version, named if the index does not list it)."""
    filename = f"vllm-{version}.tar.gz"
    tree = cache_dir / "tests" / f"vllm-{version}"
    archive = cache_dir / "sdist" / filename
    digest_file = archive.with_name(filename + ".sha256")

    digest = recorded_digest(digest_file)
    if digest and recorded_digest(tree / MARKER) == digest:
        cache.used(tree)
        _used_sdist(archive)
        origin = f"sdist {filename} (sha256 {digest[:12]}, cached)"
        return TestSource(tree, origin, identity=f"sdist {filename} sha256 {digest}")
    digest = sdist_archive(
        version, index_url=index_url, cache_dir=cache_dir, version_from=version_from
    )
    _extract_tests(archive, tree, f"vllm-{version}/tests/", digest)
    origin = f"sdist {filename} (sha256 {digest[:12]})"
    return TestSource(tree, origin, identity=f"sdist {filename} sha256 {digest}")


def sdist_archive(
    version: str, *, index_url: str, cache_dir: Path, version_from: str = "the version"
) -> str:
    """Make sure ``cache_dir/sdist/vllm-VERSION.tar.gz`` holds the index's sdist of
    ``version`` (fetched when missing or damaged); return its sha256."""
    filename = f"vllm-{version}.tar.gz"
    archive = cache_dir / "sdist" / filename
    digest_file = archive.with_name(filename + ".sha256")
    for kept in (archive, digest_file):
        if kept.exists() and not kept.is_file():
            raise ConfigError(
                f"the cache holds a folder or special file where fence-audit keeps {kept.name}",
                details={"path": str(kept), "next": "move it out of the cache folder"},
            )
    digest = recorded_digest(digest_file)
    found = sha256_file(archive) if digest and archive.is_file() else ""
    if found and found == digest:
        _used_sdist(archive)
        return digest
    try:  # none cached, or damaged (truncated): fetch it again
        url, digest = _find_on_index(index_url, filename, cache_dir, version_from)
    except SourceUnavailable as unavailable:
        if not found:
            raise
        raise _mismatch(
            f"the cached {filename} does not match the sha256 recorded when it was "
            "downloaded, and the package index cannot be reached to fetch it again",
            {"archive": str(archive), "sha256 from": f"the cache, {digest_file}"},
            expected=digest,
            found=found,
            next_step=f"run again when the index is reachable ({unavailable.summary}): "
            "the archive is fetched afresh; or pass --vllm-src PATH to a vLLM checkout",
        ) from None
    _download(url, archive, digest, index_url)
    write_text(digest_file, digest + "\n")
    return digest


def sdist_module(
    version: str,
    module: str,
    *,
    index_url: str,
    cache_dir: Path,
    version_from: str = "the version",
) -> str:
    """The text of ``module`` (dotted) as vLLM ``version``'s sdist ships it: a release's
    code, read without installing the release."""
    return sdist_file(
        version,
        module_relpath(module),
        index_url=index_url,
        cache_dir=cache_dir,
        version_from=version_from,
        next_step="check the module name (target = ...)",
    )


def sdist_file(
    version: str,
    relpath: str,
    *,
    index_url: str,
    cache_dir: Path,
    version_from: str = "the version",
    next_step: str = "check the path inside the sdist",
) -> str:
    """The text of ``relpath`` (``vllm/...py``, ``pyproject.toml``) as vLLM ``version``'s
    sdist ships it. Kept in the cache beside the archive, keyed by the archive's
    sha256, so a second read decompresses nothing."""
    kept = cache_dir / "modules" / f"vllm-{version}" / relpath
    digest_file = cache_dir / "sdist" / f"vllm-{version}.tar.gz.sha256"
    stamp = kept.with_name(kept.name + ".sha256")
    recorded = recorded_digest(digest_file)
    if kept.is_file() and recorded and recorded_digest(stamp) == recorded:
        cache.used(cache_dir / "modules" / f"vllm-{version}")
        _used_sdist(digest_file.with_name(f"vllm-{version}.tar.gz"))  # its digest was read
        return kept.read_text(encoding="utf-8")
    digest = sdist_archive(
        version, index_url=index_url, cache_dir=cache_dir, version_from=version_from
    )
    archive = cache_dir / "sdist" / f"vllm-{version}.tar.gz"
    member = f"vllm-{version}/{relpath}"
    try:
        with tarfile.open(archive, "r:gz") as tar:
            extracted = tar.extractfile(member)
            if extracted is None:
                raise KeyError(member)
            text = extracted.read().decode("utf-8")
    except KeyError:
        raise SourceUnavailable(
            f"vLLM {version}'s sdist has no {relpath}",
            details={"archive": str(archive), "next": next_step},
        ) from None
    except (tarfile.TarError, EOFError, zlib.error, UnicodeDecodeError) as error:
        raise SourceIntegrityError(
            f"{archive.name} cannot be read as a .tar.gz archive",
            details={"archive": str(archive), "error": str(error), "next": "delete it, run again"},
        ) from None
    write_text(kept, text)
    write_text(stamp, digest + "\n")
    return text


def recorded_digest(path: Path) -> str:
    """The sha256 a cache file records (a digest, a stamp), or "" when it records none
    that can be read: missing, not a file, not text, not a digest. An unreadable record
    is a cache miss, never an error: what it stood for is fetched or extracted again."""
    try:
        text = path.read_text(encoding="ascii").strip() if path.is_file() else ""
    except (OSError, ValueError):
        return ""
    return text if re.fullmatch(r"[0-9a-f]{64}", text) else ""


def _used_sdist(archive: Path) -> None:
    """Stamp a release's cached sdist and its digest, which the cache prunes together
    (:mod:`audit.core.cache`): a run that reads only the digest keeps the archive too."""
    cache.used(archive)
    cache.used(archive.with_name(archive.name + ".sha256"))


def _find_on_index(
    index_url: str, filename: str, cache_dir: Path, version_from: str
) -> tuple[str, str]:
    page = f"{index_url.rstrip('/')}/vllm/"
    request = urllib.request.Request(page, headers={"Accept": PEP691_JSON})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            listing = json.loads(response.read())
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise SourceUnavailable(
            "vLLM's tests are not in the cache and the package index is unreachable",
            details={
                "cache": str(cache_dir),
                "index": page,
                "error": str(getattr(exc, "reason", exc)),
                "next": "connect once so the sdist can be cached, point FENCE_AUDIT_INDEX_URL "
                "at a reachable index, or pass --vllm-src PATH to a vLLM checkout",
            },
        ) from None
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested or sized past reading
        listing = None
    if not isinstance(listing, dict) or not isinstance(listing.get("files", []), list):
        raise SourceUnavailable(
            "the package index did not answer with PEP 691 JSON",
            details={"index": page, "next": "use an index that serves the JSON simple API"},
        )
    for entry in listing.get("files", []):
        if isinstance(entry, dict) and entry.get("filename") == filename:
            hashes = entry.get("hashes")
            digest = hashes.get("sha256") if isinstance(hashes, dict) else None
            if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
                raise SourceIntegrityError(
                    f"the index publishes no sha256 for {filename}",
                    details={
                        "index": page,
                        "hashes": brief(repr(hashes)),
                        "next": "use an index that publishes hashes",
                    },
                )
            try:  # PEP 691 allows a URL relative to the page
                url = urllib.parse.urljoin(page, str(entry.get("url", "")))
            except ValueError as error:
                raise SourceUnavailable(
                    f"the package index gives {filename} a URL that cannot be read",
                    details={"index": page, "error": brief(error), "next": "use another index"},
                ) from None
            return url, digest.lower()
    raise ConfigError(  # the index answered: the version is what is wrong
        f"{filename} is not on the package index: no vLLM release of that version",
        details={"index": page, "version from": version_from, "next": f"check {version_from}"},
    )


def _download(url: str, archive: Path, digest: str, index_url: str) -> None:
    """Download ``url`` to ``archive``, kept only if it has the index's ``digest``."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=archive.parent, prefix=f".{archive.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        try:
            with (
                os.fdopen(fd, "wb") as out,
                urllib.request.urlopen(url, timeout=TIMEOUT_S) as response,
            ):
                shutil.copyfileobj(response, out)
        except (urllib.error.URLError, OSError, TimeoutError, ValueError) as exc:
            raise SourceUnavailable(
                f"downloading {archive.name} failed",
                details={"url": url, "error": str(exc), "next": "retry when it is reachable"},
            ) from None
        found = sha256_file(tmp)
        if found != digest:
            raise _mismatch(
                f"the download of {archive.name} does not match the sha256 the package "
                "index publishes",
                {"url": url, "sha256 from": f"the package index, {index_url}"},
                expected=digest,
                found=found,
                next_step="nothing was kept; retry, and suspect the mirror or proxy if it "
                "happens again",
            )
        tmp.replace(archive)
    finally:
        tmp.unlink(missing_ok=True)


def _mismatch(
    summary: str, where: dict[str, str], *, expected: str, found: str, next_step: str
) -> SourceIntegrityError:
    details = where | {"expected": expected, "found": found, "next": next_step}
    return SourceIntegrityError(summary, details=details)


def _extract_tests(archive: Path, tree: Path, prefix: str, digest: str) -> None:
    """Extract only ``prefix`` (the sdist's tests/) into ``tree``, atomically.

    Any member that would land outside ``tests/``, and any the standard library's
    ``data`` filter refuses (absolute or escaping links, devices), stops the extraction
    with nothing kept: exit 9, naming the member."""
    top = prefix[: -len("tests/")]  # "vllm-VERSION/", stripped from every name
    with replaced_dir(tree) as staging:
        try:
            with tarfile.open(archive, "r:gz") as tar:
                members = _tests_members(tar.getmembers(), prefix, archive)
                tar.extractall(staging, members=members, filter="data")
        except tarfile.FilterError as error:
            name = top + (error.tarinfo.name if error.tarinfo else "?")
            raise _refused(archive, name, str(error)) from None
        except (tarfile.TarError, EOFError, zlib.error) as error:
            raise SourceIntegrityError(
                f"{archive.name} cannot be read as a .tar.gz archive",
                details={
                    "archive": str(archive),
                    "error": str(error),
                    "next": "delete it and run again; suspect the index or a mirror if it recurs",
                },
            ) from None
        (staging / MARKER).write_text(digest + "\n")


def _tests_members(
    members: Iterable[tarfile.TarInfo], prefix: str, archive: Path
) -> list[tarfile.TarInfo]:
    """The members under ``prefix``, renamed to ``tests/...``. A hard link is kept only
    when its target is an earlier member of the same tree (tar stores the file first)."""
    start = len(prefix) - len("tests/")
    chosen: list[tarfile.TarInfo] = []
    files: set[str] = set()
    for member in members:
        if not member.name.startswith(prefix):
            continue
        if not posixpath.normpath(member.name).startswith(prefix):
            raise _refused(archive, member.name, "its path leaves tests/")
        if member.islnk():
            target = posixpath.normpath(member.linkname)
            if target not in files:
                why = f"a hard link to {member.linkname}, which is not a file of tests/ before it"
                raise _refused(archive, member.name, why)
            member.linkname = target[start:]
        files.add(posixpath.normpath(member.name))
        member.name = member.name[start:]
        chosen.append(member)
    if not chosen:
        raise SourceIntegrityError(
            f"{archive.name} holds no tests/ folder",
            details={
                "archive": str(archive),
                "next": "delete it and run again; suspect the index or a mirror if it recurs",
            },
        )
    return chosen


def _refused(archive: Path, member: str, why: str) -> SourceIntegrityError:
    return SourceIntegrityError(
        f"{archive.name} holds a member fence-audit refuses to extract: {member}",
        details={
            "archive": str(archive),
            "why": why,
            "next": "nothing was extracted; suspect the index or a mirror, or pass "
            "--vllm-src PATH to a vLLM checkout",
        },
    )

"""vLLM's own tests for the audited version, and the source file that is audited.

Default: the sdist of exactly the installed version, found on the package index by
name and version (PEP 691 JSON simple API), checked against the sha256 the index
publishes, cached, and only its ``tests/`` folder extracted. A second run finds the
extracted tree in the cache and touches no network.

With ``--vllm-src PATH`` (a local vLLM checkout) the tests *and* the audited target
module come from the checkout; the rest of vLLM is the installed package (see
DESIGN.md, "Auditing a checkout").
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from audit.environment import module_relpath
from audit.errors import ConfigError, SourceIntegrityError, SourceUnavailable
from audit.files import replaced_dir, write_text

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

    def target_file(self, module: str) -> Path | None:
        """The checkout's copy of ``module``; None for an sdist (installed code is audited)."""
        return self.root / module_relpath(module) if self.checkout else None


def checkout_source(path: Path, module: str) -> TestSource:
    root = path.expanduser().resolve()
    missing = [p for p in ("tests", module_relpath(module)) if not (root / p).exists()]
    if missing:
        raise ConfigError(
            f"--vllm-src {path} is not a vLLM checkout: {missing[0]} is missing",
            details={"next": "pass the root of a vLLM git checkout (it holds vllm/ and tests/)"},
        )
    return TestSource(root=root, origin=f"checkout {root}", checkout=True)


def sdist_tests(version: str, *, index_url: str, cache_dir: Path) -> TestSource:
    """vLLM's ``tests/`` from the sdist of ``version``, from the cache or the index."""
    filename = f"vllm-{version}.tar.gz"
    tree = cache_dir / "tests" / f"vllm-{version}"
    archive = cache_dir / "sdist" / filename
    digest_file = archive.with_name(filename + ".sha256")

    if (tree / MARKER).is_file() and digest_file.is_file():
        digest = digest_file.read_text().strip()
        if (tree / MARKER).read_text().strip() == digest:
            return TestSource(root=tree, origin=f"sdist {filename} (sha256 {digest[:12]}, cached)")

    if archive.is_file() and digest_file.is_file():
        digest = digest_file.read_text().strip()
        _check_digest(archive, digest, source=str(archive))
    else:
        url, digest = _find_on_index(index_url, filename, cache_dir)
        _download(url, archive, digest)
        write_text(digest_file, digest + "\n")
    _extract_tests(archive, tree, f"vllm-{version}/tests/", digest)
    return TestSource(root=tree, origin=f"sdist {filename} (sha256 {digest[:12]})")


def _find_on_index(index_url: str, filename: str, cache_dir: Path) -> tuple[str, str]:
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
    except json.JSONDecodeError:
        raise SourceUnavailable(
            "the package index did not answer with PEP 691 JSON",
            details={"index": page, "next": "use an index that serves the JSON simple API"},
        ) from None
    for entry in listing.get("files", []):
        if entry.get("filename") == filename:
            digest = entry.get("hashes", {}).get("sha256")
            if not digest:
                raise SourceIntegrityError(
                    f"the index publishes no sha256 for {filename}",
                    details={"index": page, "next": "use an index that publishes hashes"},
                )
            return str(entry["url"]), str(digest)
    raise SourceUnavailable(
        f"{filename} is not on the package index",
        details={"index": page, "next": "check [tool.fence-audit] vllm-version"},
    )


def _download(url: str, archive: Path, digest: str) -> None:
    archive.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=archive.parent, prefix=archive.name, suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            shutil.copyfileobj(resp, out)
        _check_digest(tmp, digest, source=url)
        tmp.replace(archive)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise SourceUnavailable(
            f"downloading {archive.name} failed",
            details={"url": url, "error": str(exc), "next": "retry when the index is reachable"},
        ) from None
    finally:
        tmp.unlink(missing_ok=True)


def _check_digest(path: Path, expected: str, *, source: str) -> None:
    found = hashlib.sha256(path.read_bytes()).hexdigest()
    if found != expected:
        raise SourceIntegrityError(
            f"{path.name} does not match the sha256 the package index publishes",
            details={
                "from": source,
                "expected": expected,
                "found": found,
                "next": "nothing was extracted; delete the cached file if it is there and "
                "retry, and suspect the mirror or proxy if it happens again",
            },
        )


def _extract_tests(archive: Path, tree: Path, prefix: str, digest: str) -> None:
    """Extract only ``prefix`` (the sdist's tests/) into ``tree``, atomically."""
    with replaced_dir(tree) as staging:
        with tarfile.open(archive, "r:gz") as tar:
            members = []
            for member in tar.getmembers():
                if member.name.startswith(prefix):
                    member.name = member.name[len(prefix) - len("tests/") :]
                    members.append(member)
            if not members:
                raise SourceIntegrityError(
                    f"{archive.name} holds no tests/ folder",
                    details={"archive": str(archive)},
                )
            tar.extractall(staging, members=members, filter="data")
        (staging / MARKER).write_text(digest + "\n")

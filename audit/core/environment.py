"""The installed vLLM: its version, the audited target file, and proof it is untouched.

The audit never writes into site-packages. After every run it re-hashes the target
module against the sha256 that pip recorded in the wheel's RECORD file when it
installed vLLM; any difference is a :class:`TargetModified` error.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from audit.core.errors import EnvironmentMismatch, TargetModified

DIST = "vllm"


@dataclass(frozen=True, slots=True)
class InstalledVllm:
    version: str
    location: Path  # the site-packages folder holding the vllm package


@dataclass(frozen=True, slots=True)
class Fingerprint:
    path: Path
    sha256: str  # hex digest of the file's bytes


def installed_vllm(
    expected_version: str, expected_from: str = "[tool.fence-audit] vllm-version"
) -> InstalledVllm:
    """The vLLM installed beside this interpreter; it must be ``expected_version``, which
    ``expected_from`` chose (named when it is not)."""
    try:
        dist = metadata.distribution(DIST)
    except metadata.PackageNotFoundError:
        raise EnvironmentMismatch(
            "vLLM is not installed in this Python environment",
            details={
                "python": sys.executable,
                "next": "run the audit through nox (`nox -s audit`), which installs the "
                "lean vLLM environment",
            },
        ) from None
    if dist.version != expected_version:
        raise EnvironmentMismatch(
            f"installed vLLM is {dist.version}, but the audit is configured for {expected_version}",
            details={
                "python": sys.executable,
                "version from": expected_from,
                "next": f"set {expected_from} to the installed version, or install "
                f"vllm=={expected_version} (nox installs the version the audit names)",
            },
        )
    return InstalledVllm(version=dist.version, location=Path(str(dist.locate_file(""))))


def module_relpath(module: str) -> str:
    """``a.b.c`` -> ``a/b/c.py``: where a module of the wheel lives."""
    return module.replace(".", "/") + ".py"


def installed_file(vllm: InstalledVllm, module: str) -> Path:
    path = vllm.location / module_relpath(module)
    if not path.is_file():
        raise EnvironmentMismatch(
            f"the target module {module} is not in the installed vLLM {vllm.version}",
            details={"looked in": str(path), "next": "check [tool.fence-audit] target"},
        )
    return path


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.cache
def recorded_sha256(module: str) -> str | None:
    """The hex sha256 pip recorded for ``module``'s file at install time, if any (pip
    wrote it once, at install: read once per process)."""
    relpath = module_relpath(module)
    for file in metadata.distribution(DIST).files or ():
        if file.as_posix() == relpath and file.hash is not None and file.hash.mode == "sha256":
            return base64.urlsafe_b64decode(file.hash.value + "==").hex()
    return None


def verify_untouched(vllm: InstalledVllm, module: str) -> Fingerprint:
    """Hash the installed target file and compare it with pip's RECORD."""
    path = installed_file(vllm, module)
    digest = sha256_file(path)
    recorded = recorded_sha256(module)
    if recorded is not None and digest != recorded:
        raise TargetModified(
            "the installed vLLM file differs from what pip installed",
            details={
                "file": str(path),
                "recorded": recorded,
                "found": digest,
                "next": f"reinstall vllm=={vllm.version} (nox -s audit re-creates the env "
                "when its stamp is removed) and report this as a fence-audit bug",
            },
        )
    return Fingerprint(path=path, sha256=digest)

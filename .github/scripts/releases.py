"""The vLLM releases a run of the fence-audit workflow audits, as a JSON list.

Every release with a lock (locks/vllm-VERSION.txt) is audited, so a new lock adds a
job to the matrix without editing the workflow. Standard library only: the workflow's
first job runs it on the runner's own Python, before any setup.

    releases.py                        every release with a lock, oldest first
    releases.py --only "0.32.0 0.33.0" those (each must have a lock)
    releases.py --pull-request FILE    the configured release (pyproject.toml's
                                       vllm-version) and every release whose lock is
                                       among the changed paths listed in FILE
    releases.py --shards N             the shards of each release's audit, [1, ..., N]
                                       (the matrix's second axis; 1: one job a release)
    releases.py --newer [--index URL]  the final releases of vLLM on the package index
                                       (PEP 691 JSON; default PyPI's) newer than the
                                       newest lock: the weekly run locks and audits them
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK = re.compile(r"^vllm-(?P<version>[0-9][0-9A-Za-z.+-]*)\.txt$")


class ReleaseError(Exception):
    """The requested releases cannot be audited (no lock, or none at all)."""


def version_key(version: str) -> list[tuple[int, int | str]]:
    """Orders 0.9.0 before 0.10.0 (numbers as numbers, other parts after them)."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in version.split(".")]


def locked(locks: Path) -> list[str]:
    """Every release with a lock in ``locks``, oldest first."""
    found = [m["version"] for p in locks.glob("vllm-*.txt") if (m := LOCK.match(p.name))]
    return sorted(found, key=version_key)


def configured(pyproject: Path) -> str:
    return str(tomllib.loads(pyproject.read_text())["tool"]["fence-audit"]["vllm-version"])


def select(
    available: list[str],
    *,
    only: str = "",
    changed: list[str] | None = None,
    default: str = "",
) -> list[str]:
    """The releases to audit.

    ``only``: releases named by hand (spaces or commas between them); empty means all.
    ``changed``: a pull request's changed paths: then the configured ``default``
    release, plus every release whose lock the pull request adds or changes.
    """
    if not available:
        raise ReleaseError("no lock in locks/ (locks/vllm-VERSION.txt): nothing to audit")
    if changed is not None:
        in_locks = (Path(p) for p in changed if Path(p).parent == Path("locks"))
        wanted = {default} | {m["version"] for p in in_locks if (m := LOCK.match(p.name))}
    elif only.strip():
        wanted = set(re.split(r"[\s,]+", only.strip()))
    else:
        return list(available)
    missing = sorted(wanted - set(available), key=version_key)
    if missing:
        raise ReleaseError(
            f"no lock for vLLM {', '.join(missing)}: write it with `nox -s lock -- VERSION` "
            f"(releases with a lock: {', '.join(available)})"
        )
    return [v for v in available if v in wanted]


INDEX = "https://pypi.org/simple"
PEP691_JSON = "application/vnd.pypi.simple.v1+json"
FINAL = re.compile(r"^[0-9]+(\.[0-9]+)*$")  # a final release: no rc, dev, post or local part
# vLLM's distributions on the index: its sdist and its wheels
DISTRIBUTION = re.compile(r"^vllm-(?P<version>[^-]+?)(\.tar\.gz|-.+\.whl)$")


def on_index(index: str, timeout: float = 30.0) -> list[str]:
    """Every final release of vLLM the package ``index`` lists, oldest first: its
    PEP 700 ``versions`` where given, else the versions of its files."""
    page = f"{index.rstrip('/')}/vllm/"
    request = urllib.request.Request(page, headers={"Accept": PEP691_JSON})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            listing = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ReleaseError(
            f"the package index {page} did not answer with PEP 691 JSON "
            f"({getattr(exc, 'reason', exc)}): the new releases cannot be looked up"
        ) from None
    if not isinstance(listing, dict):
        raise ReleaseError(f"the package index {page} did not answer with PEP 691 JSON")
    versions = listing.get("versions")
    if not isinstance(versions, list):
        files = listing.get("files", [])
        names = [f.get("filename", "") for f in files if isinstance(f, dict)]
        versions = [m["version"] for n in names if (m := DISTRIBUTION.match(str(n)))]
    found = {str(v) for v in versions if FINAL.match(str(v))}
    return sorted(found, key=version_key)


def newer(available: list[str], listed: list[str]) -> list[str]:
    """The releases of ``listed`` newer than every one of ``available`` (the locks)."""
    newest = max((version_key(v) for v in available), default=None)
    return [v for v in listed if newest is None or version_key(v) > newest]


MAX_SHARDS = 16  # jobs per release: past this, the baselines cost more than they share


def shards(text: str) -> list[int]:
    """``1..N`` for ``N`` (empty: 1), N a whole number from 1 to MAX_SHARDS."""
    text = text.strip() or "1"
    if not text.isdigit() or not 1 <= int(text) <= MAX_SHARDS:
        raise ReleaseError(f"shards must be a whole number from 1 to {MAX_SHARDS}, not {text!r}")
    return list(range(1, int(text) + 1))


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="releases to audit; empty: all")
    parser.add_argument(
        "--pull-request", type=Path, metavar="FILE", help="the changed paths, one a line"
    )
    parser.add_argument("--shards", metavar="N", help="print the shards 1..N of each release")
    parser.add_argument(
        "--newer", action="store_true", help="print the releases newer than the newest lock"
    )
    parser.add_argument("--index", default=INDEX, help=f"the package index (default {INDEX})")
    args = parser.parse_args(argv)
    if args.newer:
        try:
            print(json.dumps(newer(locked(root / "locks"), on_index(args.index))))
        except ReleaseError as exc:
            print(f"releases: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.shards is not None:
        try:
            print(json.dumps(shards(args.shards)))
        except ReleaseError as exc:
            print(f"releases: {exc}", file=sys.stderr)
            return 1
        return 0
    changed = None
    if args.pull_request is not None:
        changed = [line.strip() for line in args.pull_request.read_text().splitlines()]
    try:
        releases = select(
            locked(root / "locks"),
            only=args.only,
            changed=changed,
            default=configured(root / "pyproject.toml"),
        )
    except ReleaseError as exc:
        print(f"releases: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(releases))
    return 0


if __name__ == "__main__":
    sys.exit(main())

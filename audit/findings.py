"""Findings: real vLLM bugs this project's tests found, per release.

``docs/findings.toml`` (the ``findings`` key) holds one ``[[finding]]`` per bug: its
``id``, ``title``, ``doc`` (the write-up), the ``releases`` that have it (measured) and
the ``tests`` it makes fail (node ids under this repository, a prefix matches every
parameter). On a release listed there, such a test failing on the unmutated code is
a *finding*: the report lists it with its write-up and the mutant phase runs without
it (a strict expected failure stays: pytest counts it green, see :class:`Found`).
Any other red test still stops the audit (exit 4); a registered test failing on a
release the finding does not list says so, so the registry is kept true.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from audit.config import release_key
from audit.errors import ConfigError
from audit.inputs import read_toml
from audit.protocol import PROJECT_PREFIX

_KEYS = {"id", "title", "doc", "releases", "tests"}


@dataclass(frozen=True, slots=True)
class Finding:
    id: str
    title: str
    doc: str  # the write-up, relative to the project folder
    releases: tuple[str, ...]  # the releases that have the bug
    tests: tuple[str, ...]  # node ids (or prefixes) under this repository

    def exposes(self, test_id: str) -> bool:
        """Whether ``test_id`` (as the baseline names it) is one of this bug's tests."""
        local = test_id.removeprefix(PROJECT_PREFIX)
        return any(local == t or local.startswith(t + "[") for t in self.tests)

    def in_release(self, version: str) -> bool:
        return release_key(version) in {release_key(r) for r in self.releases}


@dataclass(frozen=True, slots=True)
class Found:
    """A finding on this release, with the tests of the suite it failed.

    ``failed`` tests are red on the unmutated code: no mutant can turn them red, so the
    mutant phase runs without them. ``expected`` tests are registered strict expected
    failures (pytest's xfail): green for pytest, so they stay in the mutant phase, where
    a mutant that makes one pass (the bug gone or moved) fails the run, as in CI."""

    finding: Finding
    failed: tuple[str, ...] = ()
    expected: tuple[str, ...] = ()

    @property
    def tests(self) -> tuple[str, ...]:
        return tuple(sorted((*self.failed, *self.expected)))


def load_findings(path: Path | None, project_dir: Path) -> tuple[Finding, ...]:
    """The registry at ``path`` (none if there is no file); write-ups must exist."""
    if path is None or not path.is_file():
        return ()
    data = read_toml(path, "findings file")
    entries = data.get("finding", [])
    if not isinstance(entries, list):
        raise ConfigError("[[finding]] must be an array of tables", details={"file": str(path)})
    findings = tuple(
        _finding(entry, f"{path} [[finding]] {n}") for n, entry in enumerate(entries, 1)
    )
    ids = [f.id for f in findings]
    if len(set(ids)) != len(ids):
        raise ConfigError("two findings share an id", details={"file": str(path)})
    for finding in findings:
        if not (project_dir / finding.doc).is_file():
            raise ConfigError(
                f"finding {finding.id!r}: its write-up {finding.doc} does not exist",
                details={"file": str(path), "next": "write it, or fix the doc path"},
            )
    return findings


def _finding(entry: object, where: str) -> Finding:
    if not isinstance(entry, dict):
        raise ConfigError("a [[finding]] must be a table", details={"file": where})
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in a finding", details={"file": where})
    texts = {key: entry.get(key) for key in ("id", "title", "doc")}
    lists = {key: entry.get(key) for key in ("releases", "tests")}
    for key, value in texts.items():
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{key!r} must be a non-empty string", details={"file": where})
    for key, value in lists.items():
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise ConfigError(
                f"{key!r} must be a non-empty list of strings", details={"file": where}
            )
    for release in lists["releases"] or ():
        if release_key(release) is None:
            raise ConfigError(f"{release!r} is not a vLLM release", details={"file": where})
    return Finding(
        id=str(texts["id"]),
        title=str(texts["title"]),
        doc=str(texts["doc"]),
        releases=tuple(lists["releases"] or ()),
        tests=tuple(lists["tests"] or ()),
    )


@dataclass(frozen=True, slots=True)
class Sorted:
    """The baseline's red (or expected-failure) tests, sorted against the registry."""

    found: tuple[Found, ...]  # bugs this release has, by their tests
    unexplained: tuple[str, ...]  # red tests no finding of this release explains
    unlisted: tuple[tuple[str, Finding], ...]  # a finding's test, red on a release not listed


def sort_red(
    red: Iterable[str], expected_failures: Iterable[str], findings: Iterable[Finding], version: str
) -> Sorted:
    """Which red tests are findings on ``version``. Expected failures (xfail) count as
    findings when registered for this release; otherwise they are left alone."""
    findings = tuple(findings)
    by_finding: dict[str, tuple[list[str], list[str]]] = {}
    unexplained: list[str] = []
    unlisted: list[tuple[str, Finding]] = []
    for test_id, is_red in [*((t, True) for t in red), *((t, False) for t in expected_failures)]:
        owners = [f for f in findings if f.exposes(test_id)]
        here = [f for f in owners if f.in_release(version)]
        if here:
            for finding in here:
                failed, expected = by_finding.setdefault(finding.id, ([], []))
                (failed if is_red else expected).append(test_id)
        elif is_red and owners:
            unlisted.append((test_id, owners[0]))
        elif is_red:
            unexplained.append(test_id)
    found = tuple(
        Found(f, tuple(sorted(by_finding[f.id][0])), tuple(sorted(by_finding[f.id][1])))
        for f in findings
        if f.id in by_finding
    )
    return Sorted(found, tuple(unexplained), tuple(unlisted))

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

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from audit.core.errors import invalid_file
from audit.core.inputs import known_keys, read_toml
from audit.core.protocol import PROJECT_PREFIX
from audit.setup.values import release_key

_KEYS = {"id", "title", "doc", "releases", "tests", "effect"}
# what a user of vLLM sees when the bug strikes
EFFECTS = ("wrong KV data", "lost reuse", "crash", "hang")
# The findings the vLLM under test no longer has although its release does: the
# upstream checks set it when they audit a release with the series' fixes applied
# (audit/upstream). Comma-separated ids; the fence suite reads the same variable.
FIXED_ENV = "FENCE_AUDIT_FIXED_FINDINGS"


def fixed_findings() -> frozenset[str]:
    """The ids ``$FENCE_AUDIT_FIXED_FINDINGS`` declares fixed in the code under test."""
    return frozenset(filter(None, (i.strip() for i in os.environ.get(FIXED_ENV, "").split(","))))


@dataclass(frozen=True, slots=True)
class Finding:
    id: str
    title: str
    doc: str  # the write-up, relative to the project folder
    releases: tuple[str, ...]  # the releases that have the bug
    tests: tuple[str, ...]  # node ids (or prefixes) under this repository
    effect: str = ""  # one of EFFECTS: what a vLLM user sees

    def exposes(self, test_id: str) -> bool:
        """Whether ``test_id`` (as the baseline names it) is one of this bug's tests."""
        local = test_id.removeprefix(PROJECT_PREFIX)
        return any(local == t or local.startswith(t + "[") for t in self.tests)

    def in_release(self, version: str) -> bool:
        """Whether the code under test has this bug: its release is listed, and no fix
        of it is applied (:func:`fixed_findings`)."""
        if self.id in fixed_findings():
            return False
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
        raise invalid_file(
            "[[finding]] must be an array of tables",
            str(path),
            "write each finding as a [[finding]] table",
        )
    findings = tuple(
        _finding(entry, f"{path} [[finding]] {n}") for n, entry in enumerate(entries, 1)
    )
    ids = [f.id for f in findings]
    if len(set(ids)) != len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise invalid_file(
            f"two findings share the id {twice[0]!r}",
            str(path),
            "give each finding its own id, or merge the two",
        )
    for finding in findings:
        if not (project_dir / finding.doc).is_file():
            raise invalid_file(
                f"finding {finding.id!r}: its write-up {finding.doc} does not exist",
                str(path),
                "write it, or fix the doc path",
            )
    return findings


def _finding(entry: object, where: str) -> Finding:
    if not isinstance(entry, dict):
        raise invalid_file(
            "a [[finding]] must be a table", where, "write it as a [[finding]] table"
        )
    known_keys(entry, _KEYS, "a finding", file=where)
    texts = {key: entry.get(key) for key in ("id", "title", "doc")}
    lists = {key: entry.get(key) for key in ("releases", "tests")}
    for key, value in texts.items():
        if not isinstance(value, str) or not value.strip():
            raise invalid_file(f"{key!r} must be a non-empty string", where, f'write {key} = "..."')
    for key, value in lists.items():
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise invalid_file(
                f"{key!r} must be a non-empty list of strings", where, f'write {key} = ["..."]'
            )
    effect = entry.get("effect", "")
    if effect not in ("", *EFFECTS):
        raise invalid_file(
            f"effect {effect!r} is not one of {', '.join(EFFECTS)}",
            where,
            "name what a vLLM user sees: " + ", ".join(repr(e) for e in EFFECTS),
        )
    for release in lists["releases"] or ():
        if release_key(release) is None:
            raise invalid_file(
                f"{release!r} is not a vLLM release",
                where,
                'list releases as PyPI names them, such as "0.33.0"',
            )
    return Finding(
        id=str(texts["id"]),
        title=str(texts["title"]),
        doc=str(texts["doc"]),
        releases=tuple(lists["releases"] or ()),
        tests=tuple(lists["tests"] or ()),
        effect=str(effect),
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

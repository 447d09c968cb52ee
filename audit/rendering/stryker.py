"""Stryker report: the saved results rendered in Stryker's open report format.

Stryker's mutation-testing-report-schema (the JSON Schema published in the npm
package ``mutation-testing-report-schema``) is what its HTML viewer and dashboard
read, so a fence-audit run can be browsed mutant by mutant over the audited source.
This module only converts: it renders the results view of :mod:`audit.results.report_model`
(what ``audit.json`` holds) and the audited file into one report whose format version
is the schema's own, :data:`STRYKER_SCHEMA_VERSION`. Like every other report it is
rendered by :mod:`audit.rendering.reports`, so ``fence-audit report`` re-renders it too.

Locations come from the mutant id's ``@L:C-L:C`` span (the mutated node); a mutant
without one is placed on the lines its diff changes. ``replacement`` is the node's
mutated text, given only when the diff changes nothing outside the node.

Tests are named once, under ``testFiles``, each with a short id (its place among the
run's test ids, sorted); the mutants' ``killedBy`` and ``coveredBy`` give those ids, as
Stryker's own reports do. A mutant of ``--scope file`` is covered by hundreds of tests.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit.core import environment
from audit.core.errors import AuditError
from audit.core.files import json_text
from audit.core.protocol import MutantStatus
from audit.results.scores import AUDIT_FORMAT
from audit.results.view import AuditResults, MutantRecord

STRYKER_SCHEMA_VERSION = "2"
THRESHOLDS = {"high": 80, "low": 60}  # Stryker's own defaults
STATUSES = {
    MutantStatus.KILLED: "Killed",
    MutantStatus.SURVIVED: "Survived",
    MutantStatus.TIMEOUT: "Timeout",
    MutantStatus.NO_TESTS: "NoCoverage",
    MutantStatus.ERROR: "RuntimeError",
    MutantStatus.EQUIVALENT: "Ignored",
}

# Lines relative to the function's def line, columns 0-based (audit.mutation.mutants.mutant_id).
_NODE = re.compile(r"@(\d+):(\d+)-(\d+):(\d+)#\d+$")
_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")


@dataclass(frozen=True, slots=True)
class Location:
    """Where a mutated node sits: 1-based lines, 0-based columns, end exclusive.

    Not a :class:`audit.setup.regions.Span` (whole lines of a region): this is the node,
    to the column, as Stryker's viewer underlines it.
    """

    line: int
    column: int
    end_line: int
    end_column: int

    def as_schema(self) -> dict[str, dict[str, int]]:
        """The schema's location: lines and columns both start at one."""
        return {
            "start": {"line": self.line, "column": self.column + 1},
            "end": {"line": self.end_line, "column": self.end_column + 1},
        }


class SourceNotHere(Exception):
    """The audited text is not on this machine: the report cannot be rendered here."""


def audited_text(path: str, module: str, results: AuditResults, *, digest: bool) -> str:
    """The text a module had when it was audited: at the path ``audit.json`` records,
    or, for results brought from another machine (a CI artifact), in this machine's
    installed vLLM of the same version. With ``digest``, the text must have the
    recorded sha256: locations index it, and an edited file would misplace them all.
    """
    for candidate in _places(path, module, results.vllm_version):
        try:
            raw = candidate.read_bytes()
        except OSError:
            continue
        if not digest or hashlib.sha256(raw).hexdigest() == results.target_sha256:
            return raw.decode("utf-8")
    raise SourceNotHere(f"the audited {module} ({path}) is not on this machine as it was audited")


def _places(path: str, module: str, vllm_version: str) -> Iterator[Path]:
    """Where the audited text may be, in order; the installed vLLM is looked up only
    when the recorded path does not serve."""
    yield Path(path)
    try:
        installed = environment.installed_file(environment.installed_vllm(vllm_version), module)
    except AuditError:
        return  # not installed here, or another version: only the recorded path can serve
    yield installed


def render_mutation_report(results: AuditResults) -> str:
    """``mutation.json``'s text."""
    return json_text(mutation_report(results))


def mutation_report(results: AuditResults) -> dict[str, Any]:
    """The report as a JSON-ready dict, over the audited source (:func:`audited_text`)."""
    source = audited_text(results.target_path, results.target_module, results, digest=True)
    lines = source.splitlines(keepends=True)
    ids = test_ids(results.mutants)
    files = {
        _report_path(results): {
            "language": "python",
            "source": source,
            "mutants": [_mutant(m, lines, ids) for m in results.mutants if not m.path],
        }
    }
    # Catalogue mutants of another module (the worker's) sit in their own file.
    for other in sorted({m.path for m in results.mutants if m.path}):
        mutants = [m for m in results.mutants if m.path == other]
        text = audited_text(other, mutants[0].module, results, digest=False)
        files[mutants[0].module.replace(".", "/") + ".py"] = {
            "language": "python",
            "source": text,
            "mutants": [_mutant(m, text.splitlines(keepends=True), ids) for m in mutants],
        }
    return {
        "schemaVersion": STRYKER_SCHEMA_VERSION,
        "thresholds": dict(THRESHOLDS),
        "files": files,
        "testFiles": tests_by_file(ids),
        "framework": {
            "name": results.tool_name,
            "version": results.tool_version,
            "dependencies": {"vllm": results.vllm_version},
        },
        # Free-form in the schema: what was audited, with which tests, how.
        "config": {
            "auditFormat": AUDIT_FORMAT,  # the format of the audit.json it renders
            "target": {
                "module": results.target_module,
                "path": results.target_path,
                "sha256": results.target_sha256,
            },
            "suite": {"tests_from": results.suite_origin, "paths": list(results.suite_paths)},
            "engine": results.engine,
            "duration_s": results.duration_s,
        },
    }


def test_ids(mutants: Iterable[MutantRecord]) -> dict[str, str]:
    """Every test the mutants name, to its short id in the report: its place, sorted."""
    named: set[str] = set()
    for mutant in mutants:
        named.update(mutant.covered_by)
        if mutant.killed_by:
            named.add(mutant.killed_by)
    return {test: str(number) for number, test in enumerate(sorted(named))}


def tests_by_file(ids: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The tests of ``ids`` (:func:`test_ids`), grouped by the file before ``::``."""
    files: dict[str, list[dict[str, str]]] = {}
    for test_id, short in ids.items():
        file, sep, name = test_id.partition("::")
        files.setdefault(file, []).append({"id": short, "name": name if sep else test_id})
    return {file: {"tests": tests} for file, tests in files.items()}


def location_of(mutant: MutantRecord, lines: list[str]) -> Location:
    """The mutated node from the id; failing that, the whole lines the diff changes."""
    line = mutant.line
    if match := _NODE.search(mutant.id):
        start_line, column, end_line, end_column = map(int, match.groups())
        return Location(line, column, line + end_line - start_line, end_column)
    changed = [n for n, tag, _ in _diff_lines(mutant.diff) if tag == "-"]
    end_line = max([line, *changed])
    end_text = lines[end_line - 1] if end_line <= len(lines) else ""
    return Location(line, 0, end_line, len(end_text.rstrip("\r\n")))


def _mutant(mutant: MutantRecord, lines: list[str], ids: dict[str, str]) -> dict[str, Any]:
    location = location_of(mutant, lines)
    result: dict[str, Any] = {
        "id": mutant.id,
        "mutatorName": mutant.operator,
        "location": location.as_schema(),
        "status": STATUSES[mutant.status],
    }
    replacement = _replacement(mutant.diff, lines, location)
    if replacement is not None:
        result["replacement"] = replacement
    if mutant.region:
        result["description"] = mutant.region
    if mutant.failure:
        result["statusReason"] = mutant.failure
    if mutant.killed_by:
        result["killedBy"] = [ids[mutant.killed_by]]
    result["coveredBy"] = [ids[test] for test in mutant.covered_by]
    result["testsCompleted"] = mutant.tests_run
    result["duration"] = round(mutant.duration_s * 1000, 3)  # the schema's milliseconds
    return result


def _report_path(results: AuditResults) -> str:
    """The file's key: relative to the import root (the absolute path is site-packages')."""
    name = Path(results.target_path).name
    if not results.target_module:
        return name
    module_path = results.target_module.replace(".", "/")
    return module_path + ("/__init__.py" if name == "__init__.py" else ".py")


def _diff_lines(diff: str) -> list[tuple[int, str, str]]:
    """(line of the original it stands at, tag ' ', '-' or '+', text) for each hunk line."""
    out: list[tuple[int, str, str]] = []
    at = 0
    in_hunk = False
    for text in diff.splitlines(keepends=True):
        if match := _HUNK.match(text):
            # A hunk of no original lines is placed after its line: inserts go before at + 1.
            at = int(match[1]) + (match[2] == "0")
            in_hunk = True
        elif in_hunk and text[:1] in (" ", "-", "+"):
            out.append((at, text[0], text[1:]))
            if text[0] != "+":
                at += 1
    return out


def _mutated_source(diff: str, lines: list[str]) -> str | None:
    """``lines`` with ``diff`` applied, or None when the diff does not fit them."""
    out: list[str] = []
    copied = 0  # original lines already accounted for
    entries = _diff_lines(diff)
    for at, tag, text in entries:
        if at - 1 < copied or at - 1 > len(lines):
            return None
        out.extend(lines[copied : at - 1])
        copied = at - 1
        if tag == "+":
            out.append(text)
            continue
        if copied >= len(lines) or lines[copied] != text:
            return None
        if tag == " ":
            out.append(text)
        copied += 1
    return "".join([*out, *lines[copied:]]) if entries else None


def _replacement(diff: str, lines: list[str], location: Location) -> str | None:
    """The node's text in the mutant, when everything around the node is unchanged."""
    mutated = _mutated_source(diff, lines)
    if mutated is None or not 1 <= location.line <= location.end_line <= len(lines):
        return None
    before = "".join(lines[: location.line - 1]) + lines[location.line - 1][: location.column]
    after = lines[location.end_line - 1][location.end_column :] + "".join(
        lines[location.end_line :]
    )
    if len(before) + len(after) > len(mutated):
        return None
    if not (mutated.startswith(before) and mutated.endswith(after)):
        return None  # e.g. a statement reflowed onto other lines: no exact node text
    return mutated[len(before) : len(mutated) - len(after)]

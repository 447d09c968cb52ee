"""Stryker report: ``reports/audit.json`` rewritten in Stryker's open report format.

Stryker's mutation-testing-report-schema (the JSON Schema published in the npm
package ``mutation-testing-report-schema``) is what its HTML viewer and dashboard
read, so a fence-audit run can be browsed mutant by mutant over the audited source.
This module only converts: it reads the results document of :mod:`audit.results`
(audit.json format 1) and the audited file, and writes one report whose format
version is the schema's own, :data:`STRYKER_SCHEMA_VERSION`.

Locations come from the mutant id's ``@L:C-L:C`` span (the mutated node); a mutant
without one is placed on the lines its diff changes. ``replacement`` is the node's
mutated text, given only when the diff changes nothing outside the node.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit.errors import TargetModified
from audit.files import write_json

STRYKER_SCHEMA_VERSION = "2"
AUDIT_FORMATS = frozenset({2})  # the audit.json formats this module reads
THRESHOLDS = {"high": 80, "low": 60}  # Stryker's own defaults
STATUSES = {
    "killed": "Killed",
    "survived": "Survived",
    "timeout": "Timeout",
    "no_tests": "NoCoverage",
    "error": "RuntimeError",
    "equivalent": "Ignored",
}

# Lines relative to the function's def line, columns 0-based (audit.mutants.mutant_id).
_SPAN = re.compile(r"@(\d+):(\d+)-(\d+):(\d+)#\d+$")
_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")


@dataclass(frozen=True, slots=True)
class Span:
    """A mutated stretch of the source: 1-based lines, 0-based columns, end exclusive."""

    line: int
    column: int
    end_line: int
    end_column: int

    def location(self) -> dict[str, dict[str, int]]:
        """The schema's location: lines and columns both start at one."""
        return {
            "start": {"line": self.line, "column": self.column + 1},
            "end": {"line": self.end_line, "column": self.end_column + 1},
        }


def write_mutation_report(path: Path, audit: Mapping[str, Any]) -> None:
    """Write the Stryker report of ``audit`` (an audit.json document) to ``path``."""
    write_json(path, mutation_report(audit))


def mutation_report(audit: Mapping[str, Any]) -> dict[str, Any]:
    """The report as a JSON-ready dict; reads the audited source from ``target.path``."""
    if audit.get("format") not in AUDIT_FORMATS:
        raise ValueError(f"audit.json format {audit.get('format')!r}: only {sorted(AUDIT_FORMATS)}")
    target = audit["target"]
    raw = Path(target["path"]).read_bytes()
    # Locations index this text: a file edited since the audit would misplace them all.
    if target.get("sha256") and hashlib.sha256(raw).hexdigest() != target["sha256"]:
        raise TargetModified(
            "the audited file changed since the audit; its report would point at wrong lines",
            details={"file": str(target["path"]), "next": "run the audit again"},
        )
    source = raw.decode("utf-8")
    files = {
        _report_path(target): {
            "language": "python",
            "source": source,
            "mutants": [
                _mutant(m, source.splitlines(keepends=True))
                for m in audit["mutants"]
                if not m.get("path")
            ],
        }
    }
    # Catalogue mutants of another module (the worker's) sit in their own file.
    for other in sorted({m["path"] for m in audit["mutants"] if m.get("path")}):
        text = Path(other).read_text(encoding="utf-8")
        module = next(m["module"] for m in audit["mutants"] if m.get("path") == other)
        files[module.replace(".", "/") + ".py"] = {
            "language": "python",
            "source": text,
            "mutants": [
                _mutant(m, text.splitlines(keepends=True))
                for m in audit["mutants"]
                if m.get("path") == other
            ],
        }
    tool = audit.get("tool", {})
    return {
        "schemaVersion": STRYKER_SCHEMA_VERSION,
        "thresholds": dict(THRESHOLDS),
        "files": files,
        "testFiles": tests_by_file(audit["mutants"]),
        "framework": {
            "name": tool.get("name", "fence-audit"),
            "version": str(tool.get("version", "")),
            "dependencies": {"vllm": str(audit.get("vllm_version", ""))},
        },
        # Free-form in the schema: what was audited, with which tests, how.
        "config": {
            "auditFormat": audit["format"],
            "target": dict(target),
            **{key: audit[key] for key in ("suite", "engine", "duration_s") if key in audit},
        },
    }


def tests_by_file(mutants: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every test id the mutants name, grouped by the file before ``::``."""
    ids: set[str] = set()
    for mutant in mutants:
        ids.update(mutant.get("covered_by") or ())
        if mutant.get("killed_by"):
            ids.add(mutant["killed_by"])
    files: dict[str, list[dict[str, str]]] = {}
    for test_id in sorted(ids):
        file, sep, name = test_id.partition("::")
        files.setdefault(file, []).append({"id": test_id, "name": name if sep else test_id})
    return {file: {"tests": tests} for file, tests in files.items()}


def span_of(mutant: Mapping[str, Any], lines: list[str]) -> Span:
    """The mutated node from the id; failing that, the whole lines the diff changes."""
    line = int(mutant["line"])
    if match := _SPAN.search(str(mutant["id"])):
        start_line, column, end_line, end_column = map(int, match.groups())
        return Span(line, column, line + end_line - start_line, end_column)
    changed = [n for n, tag, _ in _diff_lines(mutant.get("diff") or "") if tag == "-"]
    end_line = max([line, *changed])
    end_text = lines[end_line - 1] if end_line <= len(lines) else ""
    return Span(line, 0, end_line, len(end_text.rstrip("\r\n")))


def _mutant(mutant: Mapping[str, Any], lines: list[str]) -> dict[str, Any]:
    status = mutant["status"]
    if status not in STATUSES:
        raise ValueError(f"mutant {mutant['id']}: unknown status {status!r}")
    span = span_of(mutant, lines)
    result: dict[str, Any] = {
        "id": str(mutant["id"]),
        "mutatorName": mutant["operator"],
        "location": span.location(),
        "status": STATUSES[status],
    }
    replacement = _replacement(mutant.get("diff") or "", lines, span)
    if replacement is not None:
        result["replacement"] = replacement
    if mutant.get("region"):
        result["description"] = mutant["region"]
    if mutant.get("failure"):
        result["statusReason"] = mutant["failure"]
    if mutant.get("killed_by"):
        result["killedBy"] = [mutant["killed_by"]]
    if mutant.get("covered_by") is not None:
        result["coveredBy"] = list(mutant["covered_by"])
    if mutant.get("tests_run") is not None:
        result["testsCompleted"] = len(mutant["tests_run"])
    if mutant.get("duration_s") is not None:
        result["duration"] = round(float(mutant["duration_s"]) * 1000, 3)  # the schema's ms
    return result


def _report_path(target: Mapping[str, Any]) -> str:
    """The file's key: relative to the import root (the absolute path is site-packages')."""
    name = Path(target["path"]).name
    module = str(target.get("module") or "")
    if not module:
        return name
    return module.replace(".", "/") + ("/__init__.py" if name == "__init__.py" else ".py")


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


def _replacement(diff: str, lines: list[str], span: Span) -> str | None:
    """The node's text in the mutant, when everything around the node is unchanged."""
    mutated = _mutated_source(diff, lines)
    if mutated is None or not 1 <= span.line <= span.end_line <= len(lines):
        return None
    before = "".join(lines[: span.line - 1]) + lines[span.line - 1][: span.column]
    after = lines[span.end_line - 1][span.end_column :] + "".join(lines[span.end_line :])
    if len(before) + len(after) > len(mutated):
        return None
    if not (mutated.startswith(before) and mutated.endswith(after)):
        return None  # e.g. a statement reflowed onto other lines: no exact node text
    return mutated[len(before) : len(mutated) - len(after)]

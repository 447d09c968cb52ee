"""The saved results, read back: what every report renders, and nothing else.

``load_results`` reads ``reports/audit.json`` (format 2) into frozen dataclasses, so
the renderers (:mod:`audit.html_report`, :mod:`audit.markdown_report`,
:mod:`audit.junit_report`, :mod:`audit.stryker`; :mod:`audit.reports` lists them)
and the gate (:mod:`audit.gate`) never re-run anything and never touch raw JSON. A
missing, corrupt or foreign file is a :class:`ConfigError` that says which file and
what to do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit.errors import ConfigError
from audit.model import Fraction
from audit.protocol import MutantStatus
from audit.results import AUDIT_FORMAT, Tally

STATUS_ORDER = (
    MutantStatus.SURVIVED,
    MutantStatus.TIMEOUT,
    MutantStatus.ERROR,
    MutantStatus.NO_TESTS,
    MutantStatus.EQUIVALENT,
    MutantStatus.KILLED,
)


@dataclass(frozen=True, slots=True)
class MutantRecord:
    id: str
    region: str
    origin: str  # "mutmut" or "catalogue"
    function: str
    operator: str  # mutmut's operator, or the catalogue entry's id
    line: int
    status: MutantStatus
    killed_by: str
    failure: str
    covered_by: tuple[str, ...]
    tests_run: int
    duration_s: float
    diff: str
    cached: bool = False  # the verdict came from the result cache of an earlier run
    module: str = ""  # another module than the target (catalogue entries of the worker)
    path: str = ""  # that module's file
    equivalence: str = ""  # the reviewed reason, for a mutant recorded as equivalent
    title: str = ""  # catalogue entries: what the bug is
    invariant: str = ""  # catalogue entries: the fence invariant it breaks
    expected: str = ""  # catalogue entries: which suite should kill it
    verdict: str = ""  # catalogue entries: how the outcome compares with ``expected``
    bug: str = ""
    symptom: str = ""
    history: str = ""

    @property
    def anchor(self) -> str:
        """An HTML id for this mutant: its id with every unsafe character replaced."""
        return "m-" + re.sub(r"[^A-Za-z0-9_.-]", "-", self.id)

    @property
    def label(self) -> str:
        return self.title or self.operator


@dataclass(frozen=True, slots=True)
class RegionResult:
    name: str
    description: str
    functions: tuple[str, ...]
    tally: Tally
    lines: Fraction
    branches: Fraction
    missed_lines: tuple[int, ...]
    killed_by_vllm: int = 0  # killed by a test of vLLM's own suite

    @property
    def vllm_score(self) -> float | None:
        """The score vLLM's suite alone earns (its tests run first for every mutant)."""
        return Fraction(self.killed_by_vllm, self.tally.judged).percent


@dataclass(frozen=True, slots=True)
class CatalogueRecord:
    """A catalogue entry of the run's regions: applied (then also a mutant) or stale."""

    id: str
    region: str
    title: str
    invariant: str
    expected: str
    file: str
    stale: bool
    reason: str


@dataclass(frozen=True, slots=True)
class EquivalentRecord:
    """A reviewed equivalence verdict and what became of it in this run."""

    id: str
    state: str  # applied, expired, killed, not survived, absent
    reason: str
    reviewed: str


@dataclass(frozen=True, slots=True)
class SourceLine:
    number: int
    text: str
    coverage: str | None  # "covered", "partly", "missed"; None: not a statement
    region: str | None
    tests: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SourceFunction:
    name: str
    start: int
    end: int
    regions: tuple[str, ...]
    lines: tuple[SourceLine, ...]


@dataclass(frozen=True, slots=True)
class AuditResults:
    path: Path
    tool_version: str
    vllm_version: str
    target_module: str
    target_path: str
    target_sha256: str
    suite_origin: str
    suite_paths: tuple[str, ...]
    engine: str
    started_at: str
    duration_s: float
    overall: Tally
    regions: tuple[RegionResult, ...]
    mutants: tuple[MutantRecord, ...]
    functions: tuple[SourceFunction, ...]
    out_of_region: int
    catalogue: tuple[CatalogueRecord, ...] = ()
    overall_killed_by_vllm: int = 0
    equivalents: tuple[EquivalentRecord, ...] = ()
    tool_name: str = "fence-audit"

    @property
    def vllm_score(self) -> float | None:
        """The overall score vLLM's suite alone earns (see RegionResult.vllm_score)."""
        return Fraction(self.overall_killed_by_vllm, self.overall.judged).percent

    def stale(self) -> tuple[CatalogueRecord, ...]:
        return tuple(c for c in self.catalogue if c.stale)

    def region(self, name: str) -> RegionResult:
        return next(r for r in self.regions if r.name == name)

    def mutants_of(self, region: str) -> tuple[MutantRecord, ...]:
        return tuple(m for m in self.mutants if m.region == region)

    def survivors(self) -> tuple[MutantRecord, ...]:
        return tuple(m for m in self.mutants if m.status is MutantStatus.SURVIVED)


def load_results(path: Path) -> AuditResults:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            "no results file",
            details={"file": str(path), "next": "run `fence-audit mutate` first"},
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(
            "the results file is not valid JSON",
            details={
                "file": str(path),
                "error": str(error),
                "next": "run `fence-audit mutate` again",
            },
        ) from None
    if not isinstance(document, dict) or document.get("format") != AUDIT_FORMAT:
        found = document.get("format") if isinstance(document, dict) else None
        raise ConfigError(
            f"the results file has format {found!r}; this fence-audit reads format {AUDIT_FORMAT}",
            details={"file": str(path), "next": "run `fence-audit mutate` with this version"},
        )
    try:
        return _results(path, document)
    except (KeyError, TypeError, ValueError) as error:
        raise ConfigError(
            "the results file is incomplete or damaged",
            details={
                "file": str(path),
                "error": f"{type(error).__name__}: {error}",
                "next": "run `fence-audit mutate` again",
            },
        ) from None


def _results(path: Path, document: Mapping[str, Any]) -> AuditResults:
    tests = document["tests"]
    regions = tuple(
        RegionResult(
            name=name,
            description=body.get("description", ""),
            functions=tuple(body.get("functions", ())),
            tally=_tally(body),
            lines=_fraction(body.get("lines")),
            branches=_fraction(body.get("branches")),
            missed_lines=tuple(body.get("missed_lines", ())),
            killed_by_vllm=int(body.get("killed_by_vllm", body["killed"])),
        )
        for name, body in document["regions"].items()
    )
    functions = tuple(
        SourceFunction(
            name=f["name"],
            start=int(f["start"]),
            end=int(f["end"]),
            regions=tuple(f["regions"]),
            lines=tuple(
                SourceLine(
                    number=int(line["n"]),
                    text=line["text"],
                    coverage=line["coverage"],
                    region=line["region"],
                    tests=tuple(tests[i] for i in line["tests"]),
                )
                for line in f["lines"]
            ),
        )
        for f in document["source"]["functions"]
    )
    mutants = tuple(_mutant(m) for m in document["mutants"])
    suite = document.get("suite", {})
    return AuditResults(
        path=path,
        tool_version=document["tool"]["version"],
        tool_name=document["tool"].get("name", "fence-audit"),
        vllm_version=document["vllm_version"],
        target_module=document["target"]["module"],
        target_path=document["target"]["path"],
        target_sha256=document["target"]["sha256"],
        suite_origin=str(suite.get("tests_from", "")),
        suite_paths=tuple(suite.get("paths", ())),
        engine=document.get("engine", ""),
        started_at=document.get("started_at", ""),
        duration_s=float(document.get("duration_s", 0.0)),
        overall=_tally(document["score"]),
        regions=regions,
        mutants=mutants,
        functions=functions,
        out_of_region=len(document.get("out_of_region", ())),
        catalogue=tuple(
            CatalogueRecord(
                id=c["id"],
                region=c["region"],
                title=c["title"],
                invariant=c["invariant"],
                expected=c["expected"],
                file=c["file"],
                stale=c["state"] == "stale",
                reason=c.get("reason", ""),
            )
            for c in document.get("catalogue", ())
        ),
        equivalents=tuple(
            EquivalentRecord(e["id"], e["state"], e["reason"], e.get("reviewed", ""))
            for e in document.get("equivalents", ())
        ),
        overall_killed_by_vllm=int(
            document["score"].get("killed_by_vllm", document["score"]["killed"])
        ),
    )


def _tally(body: Mapping[str, Any]) -> Tally:
    return Tally(**{field: int(body.get(field, 0)) for field in Tally.__slots__})


def _fraction(body: Mapping[str, Any] | None) -> Fraction:
    if not body:
        return Fraction(0, 0)
    return Fraction(int(body["covered"]), int(body["total"]))


def _mutant(body: Mapping[str, Any]) -> MutantRecord:
    return MutantRecord(
        id=body["id"],
        region=body["region"],
        origin=body["origin"],
        function=body["function"],
        operator=body["operator"],
        line=int(body["line"]),
        status=MutantStatus(body["status"]),
        killed_by=body.get("killed_by") or "",
        failure=body.get("failure") or "",
        covered_by=tuple(body.get("covered_by", ())),
        tests_run=len(body.get("tests_run", ())),
        duration_s=float(body.get("duration_s", 0.0)),
        diff=body.get("diff", ""),
        cached=bool(body.get("cached", False)),
        module=body.get("module", ""),
        path=body.get("path", ""),
        equivalence=body.get("equivalence", ""),
        title=body.get("title", ""),
        invariant=body.get("invariant", ""),
        expected=body.get("expected", ""),
        verdict=body.get("verdict", ""),
        bug=body.get("bug", ""),
        symptom=body.get("symptom", ""),
        history=body.get("history", ""),
    )

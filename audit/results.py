"""The results of a run: per-region scores and ``reports/audit.json``.

Score = killed / (killed + survived + timeout), as a percentage; mutants with no
covering test and mutants that could not be judged (errors) are counted apart.

audit.json format history:
- 1: first release.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit import __version__
from audit.files import write_json
from audit.model import Mutant, MutantResult, MutantStatus, Target
from audit.mutants import OutOfRegion

AUDIT_FORMAT = 1


@dataclass(frozen=True, slots=True)
class Tally:
    killed: int = 0
    survived: int = 0
    timeout: int = 0
    no_tests: int = 0
    error: int = 0

    @property
    def judged(self) -> int:
        """The score's denominator."""
        return self.killed + self.survived + self.timeout

    @property
    def score(self) -> float | None:
        return 100.0 * self.killed / self.judged if self.judged else None

    @classmethod
    def of(cls, statuses: Iterable[MutantStatus]) -> Tally:
        counts = Counter(status.value for status in statuses)
        return cls(**{field: counts.get(field, 0) for field in cls.__slots__})


def tally_by_region(
    mutants: Iterable[Mutant], verdicts: Mapping[str, MutantResult], regions: Iterable[str]
) -> dict[str, Tally]:
    statuses: dict[str, list[MutantStatus]] = {name: [] for name in regions}
    for mutant in mutants:
        statuses.setdefault(mutant.region, []).append(verdicts[mutant.id].status)
    return {name: Tally.of(values) for name, values in statuses.items()}


def write_audit(
    path: Path,
    *,
    target: Target,
    vllm_version: str,
    suite: dict[str, Any],
    mutants: tuple[Mutant, ...],
    verdicts: Mapping[str, MutantResult],
    out_of_region: tuple[OutOfRegion, ...],
    regions: Iterable[str],
    duration_s: float,
    engine: str = "fork",
) -> dict[str, Any]:
    tallies = tally_by_region(mutants, verdicts, regions)
    overall = Tally.of(verdicts[m.id].status for m in mutants)
    document = {
        "format": AUDIT_FORMAT,
        "tool": {"name": "fence-audit", "version": __version__},
        "vllm_version": vllm_version,
        "target": {"module": target.module, "path": str(target.path), "sha256": target.sha256},
        "suite": suite,
        "engine": engine,
        "duration_s": round(duration_s, 3),
        "score": _score(overall),
        "regions": {name: _score(tally) for name, tally in tallies.items()},
        "mutants": [_mutant(m, verdicts[m.id]) for m in mutants],
        "out_of_region": [
            {"id": o.id, "function": o.function, "line": o.line} for o in out_of_region
        ],
    }
    write_json(path, document)
    return document


def format_scores(tallies: Mapping[str, Tally], overall: Tally) -> str:
    header = ("region", "killed", "survived", "timeout", "no tests", "error", "score")
    rows = [
        (name, *(str(getattr(t, f)) for f in Tally.__slots__), _percent(t))
        for name, t in [*tallies.items(), ("all", overall)]
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    title = "  ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)).rstrip()
    return "\n".join([title, "  ".join("-" * w for w in widths), *lines])


def _percent(tally: Tally) -> str:
    score = tally.score
    return "n/a" if score is None else f"{score:.1f}% of {tally.judged}"


def _score(tally: Tally) -> dict[str, Any]:
    return {
        "killed": tally.killed,
        "survived": tally.survived,
        "timeout": tally.timeout,
        "no_tests": tally.no_tests,
        "error": tally.error,
        "judged": tally.judged,
        "score": None if tally.score is None else round(tally.score, 2),
    }


def _mutant(mutant: Mutant, result: MutantResult) -> dict[str, Any]:
    return {
        "id": mutant.id,
        "region": mutant.region,
        "origin": mutant.origin,
        "function": mutant.function,
        "operator": mutant.operator,
        "line": mutant.line,
        "status": result.status.value,
        "killed_by": result.killed_by or None,
        "failure": result.failure or None,
        "covered_by": list(mutant.covered_by),
        "tests_run": list(result.tests_run),
        "duration_s": result.duration_s,
        "cached": result.cached,
        "diff": mutant.diff,
    }

"""The results of a run: per-region scores and ``reports/audit.json``.

Score = killed / (killed + survived + timeout), as a percentage; mutants with no
covering test and mutants that could not be judged (errors) are counted apart.

audit.json format history:
- 1: first release.
- 2: ``started_at``; per region its description, functions and line/branch coverage;
  ``tests`` (every baseline test id) and ``source`` (the region functions' lines with
  their coverage, region and covering tests, as indices into ``tests``): what the
  reports need, so they are rendered from this file alone. Catalogue entries: their
  mutants carry ``title``, ``invariant``, ``expected``, ``verdict``, ``bug``,
  ``symptom``, ``history``; ``catalogue`` lists every entry of the run's regions with
  ``applied``, ``stale``, ``carried`` (the release already has the entry's code: it
  carries the bug) or ``not yet`` (the code came in a later release), with the reason.
  Per region and overall, ``killed_by_vllm``:
  mutants killed by a test of vLLM's own suite (covering tests run vLLM's first).
  A mutant of another module than the target carries its ``module`` and ``path``.
  Status ``equivalent`` (a reviewed survivor, outside the score) with the mutant's
  ``equivalence`` reason; ``equivalents`` lists each record of mutants/equivalents.toml
  with its state (applied, expired, killed, not survived, absent).
  ``findings``: the real vLLM bugs this release has (docs/findings.toml) whose tests
  failed on the unmutated code, each with ``id``, ``title``, ``doc``, ``releases`` and
  its ``tests``, of which ``left_out`` were red on the unmutated code and judged no
  mutant (strict expected failures stay in the mutant phase); absent when none.
  Per region, ``absent``: the parts of the region this vLLM release does not have yet
  (a selection whose ``since`` is later), each as text; absent when there are none.
  ``incomplete``: ``{"judged": N, "of": M}`` for an interrupted run, whose file holds
  only the N mutants judged so far; absent for a complete run.
  ``since``: a pull-request run (``--since REF``): ``ref``, ``commit`` (the sha git
  resolved it to), ``path`` and ``old_path`` (the target's path at REF; null when new
  since), ``lines`` (the changed lines of the target as inclusive ``[first, last]``
  runs), ``deletions`` (pure deletions: the line before each, 0 for the top) and
  ``score``: the tally of every mutant of the run, all on changed lines. Its mutants
  outside every region are in the region ``changed-outside-regions``, which the
  overall ``score`` leaves out. Absent for a run of the whole fence. Each mutant's
  ``lines``: the lines of the audited file it changes (a catalogue entry: its anchor
  statements'); absent in older files. ``shard``: one shard of a run dealt over N
  jobs (``mutate --shard K/N``, :mod:`audit.results.shards`): ``index``, ``count``, ``mutants``
  (the ids dealt to this shard), ``run`` (every mutant id of the run, in its order),
  ``equivalents`` (the ids of the run's equivalents records, in the file's order) and
  ``costs`` (the digest of the test durations the mutants were dealt by); the file
  holds only this shard's mutants and their equivalents records. Absent for a whole
  run, and in what ``fence-audit merge`` writes. ``random_workloads`` (the selectors of
  the suite's random workloads) when the run judged every fence mutant a second time
  by them alone (``mutate --random-alone``, :mod:`audit.judging.alone`): each such mutant then
  has ``random`` (``status``, ``killed_by``, ``failure``, ``duration_s``); no tally
  is stored for it, the reports count it from the mutants. ``deep`` (``profile``,
  ``seconds``) when the run looked again at every survivor of the fence with a longer
  search (``mutate --deep``, :mod:`audit.judging.deep`): each such survivor then has ``deep``,
  as ``random``. Every count and score is
  recomputed from the mutants on read (:mod:`audit.results.schema`): a file whose stored
  tallies disagree is refused.
- 3: each mutant's ``covered_by`` and ``tests_run`` are indices into ``tests``, as the
  source lines' tests already were (a mutant of ``--scope file`` names hundreds of
  tests: 52 MB of names for the module's 2,144 mutants). ``killed_by`` and ``hung``
  stay names. Format 2 is still read.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit import __version__
from audit.core.files import write_json
from audit.core.protocol import MutantStatus, is_project_test
from audit.mutation.catalogue_mutants import CatalogueMutants
from audit.mutation.mutants import OutOfRegion
from audit.mutation.scope import APART
from audit.setup.config import DeepLook
from audit.setup.findings import Found
from audit.setup.model import (
    CoverageMap,
    Fraction,
    Mutant,
    MutantResult,
    RegionCoverage,
    Target,
    percent_text,
)
from audit.setup.regions import Region, find_function, first_line

AUDIT_FORMAT = 3
READ_FORMATS = (2, AUDIT_FORMAT)  # what load_results reads: a run before format 3 too


@dataclass(frozen=True, slots=True)
class Tally:
    killed: int = 0
    survived: int = 0
    timeout: int = 0
    no_tests: int = 0
    error: int = 0
    equivalent: int = 0  # reviewed equivalent survivors: outside the score

    @property
    def judged(self) -> int:
        """The score's denominator."""
        return self.killed + self.survived + self.timeout

    @property
    def score(self) -> float | None:
        """None when nothing was judged: no evidence either way."""
        return Fraction(self.killed, self.judged).percent

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
    regions: tuple[Region, ...],
    coverage: tuple[RegionCoverage, ...],
    coverage_map: CoverageMap,
    line_coverage: Mapping[int, str],
    started_at: str,
    duration_s: float,
    engine: str = "fork",
    catalogue: CatalogueMutants | None = None,
    equivalents: list[dict[str, Any]] | None = None,
    incomplete: tuple[int, int] | None = None,
    since: dict[str, Any] | None = None,
    findings: tuple[Found, ...] = (),
    scope: str = "regions",
    shard: dict[str, Any] | None = None,
    random: Mapping[str, MutantResult] | None = None,
    random_workloads: tuple[str, ...] = (),
    deep: Mapping[str, MutantResult] | None = None,
    deep_look: DeepLook | None = None,
) -> dict[str, Any]:
    tallies = tally_by_region(mutants, verdicts, (r.name for r in regions))
    reasons = {e["id"]: e["reason"] for e in equivalents or () if e["state"] == "applied"}
    # The groups outside every region (pull-request mode's changed code, --scope file's
    # functions) are scored apart.
    scored = tuple(m for m in mutants if m.region not in APART)
    overall = Tally.of(verdicts[m.id].status for m in scored)
    by_name = {c.name: c for c in coverage}
    absent = {r.name: [str(part) for part in r.absent] for r in regions if r.absent}
    test_ids = sorted(
        set(coverage_map.durations)
        | {t for m in mutants for t in m.covered_by}
        | {t for m in mutants for t in verdicts[m.id].tests_run}
    )
    index = {test_id: i for i, test_id in enumerate(test_ids)}
    document = {
        "format": AUDIT_FORMAT,
        "tool": {"name": "fence-audit", "version": __version__},
        "vllm_version": vllm_version,
        "target": {"module": target.module, "path": str(target.path), "sha256": target.sha256},
        "suite": suite,
        "engine": engine,
        "started_at": started_at,
        "duration_s": round(duration_s, 3),
        "score": {**_score(overall), "killed_by_vllm": _by_vllm(scored, verdicts)},
        "regions": {
            name: {
                **_region(by_name.get(name)),
                **({"absent": absent[name]} if name in absent else {}),
                **_score(tally),
                "killed_by_vllm": _by_vllm((m for m in mutants if m.region == name), verdicts),
            }
            for name, tally in tallies.items()
        },
        "tests": test_ids,
        "source": _source(target, regions, coverage_map, line_coverage, index),
        "mutants": [
            _mutant(
                m,
                verdicts[m.id],
                index,
                catalogue,
                reasons.get(m.id, ""),
                (random or {}).get(m.id),
                (deep or {}).get(m.id),
            )
            for m in mutants
        ],
        "catalogue": _catalogue(catalogue),
        "equivalents": equivalents or [],
        "out_of_region": [
            {"id": o.id, "function": o.function, "line": o.line} for o in out_of_region
        ],
    }
    if scope != "regions":  # --scope file: every mutant of the module
        document["scope"] = scope
    if incomplete is not None:  # an interrupted run: only the mutants judged so far
        document["incomplete"] = {"judged": incomplete[0], "of": incomplete[1]}
    if since is not None:  # pull-request mode: every mutant lies on changed code
        changed = Tally.of(verdicts[m.id].status for m in mutants)
        score = {**_score(changed), "killed_by_vllm": _by_vllm(mutants, verdicts)}
        document["since"] = {**since, "score": score}
    if findings:  # real vLLM bugs this release has: their tests judged no mutant
        document["findings"] = [
            {
                "id": found.finding.id,
                "title": found.finding.title,
                "doc": found.finding.doc,
                "releases": list(found.finding.releases),
                "tests": list(found.tests),
                "left_out": list(found.failed),  # red on the unmutated code: judged nothing
            }
            for found in findings
        ]
    if shard is not None:  # one shard of a run: merge puts the shards together
        document["shard"] = shard
    if random_workloads:  # --random-alone: each fence mutant's ``random`` judgement
        document["random_workloads"] = list(random_workloads)
    if deep_look is not None:  # --deep: each fence survivor's ``deep`` judgement
        document["deep"] = {"profile": deep_look.profile, "seconds": deep_look.seconds}
    write_json(path, document)
    return document


def format_scores(tallies: Mapping[str, Tally], overall: Tally) -> str:
    """The tallies as a table: the regions, their overall row ("all"), then the groups
    scored apart from them (code outside every region), marked and footnoted so."""
    header = ("region", "killed", "survived", "timeout", "no tests", "error", "equivalent", "score")
    fence = [(name, t) for name, t in tallies.items() if name not in APART]
    apart = [(f"{name} *", t) for name, t in tallies.items() if name in APART]
    rows = [
        (name, *(str(getattr(t, f)) for f in Tally.__slots__), _score_text(t))
        for name, t in [*fence, ("all", overall), *apart]
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    title = "  ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)).rstrip()
    note = ["* scored apart: outside every region, not counted in all"] if apart else []
    return "\n".join([title, "  ".join("-" * w for w in widths), *lines, *note])


def _score_text(tally: Tally) -> str:
    shown = percent_text(tally.score)
    return shown if tally.score is None else f"{shown} of {tally.judged}"


def score_fields(tally: Tally, killed_by_vllm: int) -> dict[str, Any]:
    """A tally as audit.json stores it: a region's, the overall ``score``, ``since.score``."""
    return {**_score(tally), "killed_by_vllm": killed_by_vllm}


def _score(tally: Tally) -> dict[str, Any]:
    return {
        "killed": tally.killed,
        "survived": tally.survived,
        "timeout": tally.timeout,
        "no_tests": tally.no_tests,
        "error": tally.error,
        "equivalent": tally.equivalent,
        "judged": tally.judged,
        "score": None if tally.score is None else round(tally.score, 2),
    }


def _region(coverage: RegionCoverage | None) -> dict[str, Any]:
    if coverage is None:
        return {}
    return {
        "description": coverage.description,
        "functions": list(coverage.functions),
        "lines": {"covered": coverage.lines.covered, "total": coverage.lines.total},
        "branches": {"covered": coverage.branches.covered, "total": coverage.branches.total},
        "missed_lines": list(coverage.missed_lines),
        "tests": len(coverage.tests),
    }


def _source(
    target: Target,
    regions: tuple[Region, ...],
    coverage_map: CoverageMap,
    line_coverage: Mapping[int, str],
    index: Mapping[str, int],
) -> dict[str, Any]:
    """The region functions' source, line by line, with what the reports show per line
    (a line's tests as places in ``tests``: ``index``)."""
    text = target.path.read_text(encoding="utf-8")
    all_lines = text.splitlines()
    tree = ast.parse(text)
    region_of = {line: r.name for r in regions for line in r.lines}
    functions = []
    for name in dict.fromkeys(f for r in regions for f in r.functions):
        node = find_function(tree, name)
        if node is None:
            continue
        start = first_line(node)
        end = node.end_lineno or node.lineno
        functions.append(
            {
                "name": name,
                "start": start,
                "end": end,
                "regions": sorted({r.name for r in regions if name in r.functions}),
                "lines": [
                    {
                        "n": n,
                        "text": all_lines[n - 1],
                        "coverage": line_coverage.get(n),
                        "region": region_of.get(n),
                        "tests": [index[t] for t in coverage_map.lines.get(n, ())],
                    }
                    for n in range(start, end + 1)
                ],
            }
        )
    return {"path": str(target.path), "functions": functions}


def _by_vllm(mutants: Iterable[Mutant], verdicts: Mapping[str, MutantResult]) -> int:
    return sum(
        1 for m in mutants if killed_by_vllm(verdicts[m.id].status, verdicts[m.id].killed_by)
    )


def killed_by_vllm(status: MutantStatus, killed_by: str) -> bool:
    """Killed by a test of vLLM's own suite (a kill with no killer named, as
    ``--engine mutmut`` records it, counts as vLLM's)."""
    return status is MutantStatus.KILLED and not is_project_test(killed_by)


def expectation_verdict(expected: str, result: MutantResult) -> str:
    """How an entry's outcome compares with the suite expected to kill it."""
    if result.status is MutantStatus.KILLED:
        suite = "project" if is_project_test(result.killed_by) else "vllm"
        if expected == suite:
            return "as expected"
        if expected == "known-gap":
            name = "this project's" if suite == "project" else "vLLM's"
            return f"known gap, yet killed by {name} tests"
        if expected == "vllm":
            return "expected vLLM's tests to kill it; only this project's did"
        return "expected only this project's tests to kill it; vLLM's did"
    if result.status in (MutantStatus.SURVIVED, MutantStatus.TIMEOUT):
        if expected == "known-gap":
            return "as expected"
        return f"expected a kill, {result.status.value}"
    if result.status is MutantStatus.NO_TESTS:
        return "as expected" if expected == "known-gap" else "expected a kill; no test reaches it"
    return f"not judged ({result.status.value})"


def _catalogue(catalogue: CatalogueMutants | None) -> list[dict[str, Any]]:
    if catalogue is None:
        return []
    states = {s.entry.mutant_id: ("stale", s.reason) for s in catalogue.stale}
    states |= {c.entry.mutant_id: ("carried", c.reason) for c in catalogue.carried}
    states |= {n.entry.mutant_id: ("not yet", n.reason) for n in catalogue.not_yet}
    return [
        {
            "id": mutant_id,
            "region": entry.region,
            "title": entry.title,
            "invariant": entry.invariant,
            "expected": entry.expected,
            "file": entry.path.name,
            "state": states.get(mutant_id, ("applied", ""))[0],
            "reason": states.get(mutant_id, ("applied", ""))[1],
        }
        for mutant_id, entry in catalogue.entries.items()
    ]


def _mutant(
    mutant: Mutant,
    result: MutantResult,
    index: Mapping[str, int],
    catalogue: CatalogueMutants | None = None,
    equivalence: str = "",
    random: MutantResult | None = None,
    deep: MutantResult | None = None,
) -> dict[str, Any]:
    extra: dict[str, Any] = {"equivalence": equivalence} if equivalence else {}
    for key, second in (("random", random), ("deep", deep)):
        if second is not None:  # judged again by the random workloads (alone, deeper)
            extra[key] = {
                "status": second.status.value,
                "killed_by": second.killed_by or None,
                "failure": second.failure or None,
                "duration_s": second.duration_s,
            }
    entry = catalogue.entries.get(mutant.id) if catalogue else None
    if entry is not None:
        extra |= {
            "title": entry.title,
            "invariant": entry.invariant,
            "expected": entry.expected,
            "verdict": expectation_verdict(entry.expected, result),
            "bug": entry.bug,
            "symptom": entry.symptom,
            "history": entry.history,
        }
    return {
        "id": mutant.id,
        "region": mutant.region,
        "origin": mutant.origin,
        "function": mutant.function,
        "operator": mutant.operator,
        "line": mutant.line,
        "lines": sorted(set(mutant.changed_lines)),
        "status": result.status.value,
        "killed_by": result.killed_by or None,
        "failure": result.failure or None,
        "covered_by": [index[t] for t in mutant.covered_by],
        "tests_run": [index[t] for t in result.tests_run],
        **({"hung": list(result.hung)} if result.hung else {}),
        "duration_s": result.duration_s,
        "cached": result.cached,
        "diff": mutant.diff,
        **extra,
        **({"module": mutant.module, "path": mutant.path} if mutant.module else {}),
    }

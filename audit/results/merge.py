"""``fence-audit merge``: one run's ``audit.json`` from its shards' (:mod:`audit.results.shards`).

Every shard ran the baseline and built the whole run's mutants, then judged only those
dealt to it. Merge checks, each failure one error naming the files:

- every file is one shard's results, read as strictly as any results file (the reader
  checks that a shard holds exactly the mutants dealt to it);
- they are of one run: the same fence-audit, vLLM version, target (module and
  sha256), suite, engine, scope, regions and ``--since`` change, the same N, the same
  mutants of the run and equivalents records, dealt by the same test durations;
- each index 1..N is given exactly once;
- no shard was interrupted (exit 13, as the gate refuses an interrupted run);
- what the baseline decides is the same in every shard: each region's coverage, the
  tests, the source lines with their tests, the catalogue's records, the findings,
  the mutants outside every region;
- each mutant of the run is in exactly one shard.

The merged document is shard 1's, with the run's mutants in the run's order, the
equivalents records in the file's order, every tally recomputed from the mutants,
the earliest start and the longest shard's duration (the shards run side by side),
and no ``shard``. Merge works on the JSON documents, not on the typed view, because
the view keeps a count where the file keeps a list (the tests a mutant ran, the
mutants outside every region); what it writes is read back through the strict
reader before any report is rendered from it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit.core.errors import ConfigError, ResultsIncomplete
from audit.core.inputs import resolved
from audit.core.text import first_of
from audit.mutation.scope import APART
from audit.results.report_model import load_results
from audit.results.schema import LATER_TALLY_FIELDS, TALLY_FIELDS
from audit.results.scores import score_fields
from audit.results.view import AuditResults, ShardRecord, tally_of

_ONE_RUN = (
    "merge the audit.json of every shard of one run: `fence-audit mutate --shard K/N` "
    "for K = 1..N, from one commit, with the same options"
)


@dataclass(frozen=True, slots=True)
class Part:
    """One shard's results: the typed view, and the document as written."""

    path: Path
    results: AuditResults
    shard: ShardRecord
    document: dict[str, Any]


def merged_results(paths: Sequence[Path], destination: Path) -> dict[str, Any]:
    """The document of the run whose shards' results are at ``paths``, to be written to
    ``destination`` (which must not be one of them: a shard's file is not replaced)."""
    given = {resolved(path, "the shard") for path in paths}
    if resolved(destination, "the merged audit.json") in given:
        raise ConfigError(
            "the merged audit.json would replace a shard's results",
            details={"file": str(destination), "next": "give merge another --reports folder"},
        )
    return merged_document([read_part(path) for path in paths])


def read_part(path: Path) -> Part:
    results = load_results(path)
    if results.shard is None:
        raise ConfigError(
            f"{path.name} is the results of a whole run, not of a shard (no `shard` field)",
            details={"file": str(path), "next": _ONE_RUN},
        )
    document = json.loads(path.read_text(encoding="utf-8"))  # read once, well formed
    return Part(path, results, results.shard, document)


def merged_document(given: Sequence[Part]) -> dict[str, Any]:
    """The run's document from its shards' (each checked: see the module's doc)."""
    parts = _in_order(given)
    first = parts[0]
    run = first.shard.run
    records = {m["id"]: m for part in parts for m in part.document["mutants"]}
    views = {m.id: m for part in parts for m in part.results.mutants}
    mutants = [views[mutant_id] for mutant_id in run]
    document = copy.deepcopy(first.document)
    del document["shard"]
    document["mutants"] = [records[mutant_id] for mutant_id in run]
    document["equivalents"] = _equivalents(parts)
    # The groups outside every region (--since, --scope file) are scored apart, as
    # mutate scores them.
    document["score"] = score_fields(*tally_of([m for m in mutants if m.region not in APART]))
    for name, body in document["regions"].items():
        body.update(score_fields(*tally_of([m for m in mutants if m.region == name])))
    if document.get("since") is not None:
        document["since"]["score"] = score_fields(*tally_of(mutants))
    started = [part.results.started_at for part in parts if part.results.started_at]
    if started:  # each written the same way, in UTC: the strings sort as the times do
        document["started_at"] = min(started)
    document["duration_s"] = max(part.results.duration_s for part in parts)
    return document


def _in_order(given: Sequence[Part]) -> list[Part]:
    """The shards by index, once checked to be every shard of one run, each whole."""
    first = given[0]
    for part in given[1:]:
        _same_run(first, part)
    by_index: dict[int, Part] = {}
    for part in given:
        if part.shard.index in by_index:
            raise ConfigError(
                f"shard {part.shard} is given twice",
                details={
                    "files": f"{by_index[part.shard.index].path}, {part.path}",
                    "next": "give each shard's audit.json once",
                },
            )
        by_index[part.shard.index] = part
    count = first.shard.count
    missing = [f"{index}/{count}" for index in range(1, count + 1) if index not in by_index]
    if missing:
        raise ConfigError(
            f"shard {first_of(missing, 5)} missing: the run was dealt over {count} shards",
            details={
                "given": ", ".join(f"{p.shard} ({p.path})" for _, p in sorted(by_index.items())),
                "next": "give the audit.json of every shard, 1 to N",
            },
        )
    parts = [by_index[index] for index in range(1, count + 1)]
    for part in parts:
        if part.results.incomplete is not None:
            judged, total = part.results.incomplete
            raise ResultsIncomplete(
                f"shard {part.shard} is incomplete: it was interrupted after {judged} of "
                f"{total} mutants",
                details={
                    "file": str(part.path),
                    "next": f"run `fence-audit mutate --shard {part.shard}` again (it "
                    "resumes from the verdict cache), then merge",
                },
            )
    for part in parts[1:]:
        _same_baseline(parts[0], part)
    _dealt_once(parts)
    return parts


def _same_run(first: Part, other: Part) -> None:
    mine, theirs = _run_of(first), _run_of(other)
    for what, value in mine.items():
        if theirs[what] != value:
            costs = what == "test durations the mutants were dealt by"
            raise ConfigError(
                f"the shards are not of one run: they differ in their {what}",
                details={
                    f"shard {first.shard}": f"{_shown(value)} ({first.path})",
                    f"shard {other.shard}": f"{_shown(theirs[what])} ({other.path})",
                    "next": "give every shard the same --shard-costs (a coverage-map.json), "
                    "then run them again"
                    if costs
                    else _ONE_RUN,
                },
            )


def _run_of(part: Part) -> dict[str, object]:
    """What makes a run: every shard of one has the same."""
    results, shard = part.results, part.shard
    since = results.since
    return {
        "fence-audit version": results.tool_version,
        "vLLM version": results.vllm_version,
        "target": f"{results.target_module} (sha256 {results.target_sha256})",
        "suite": f"{results.suite_origin}: {', '.join(results.suite_paths)}",
        "engine": results.engine,
        "scope": part.document.get("scope"),  # a field later versions may write
        "regions": ", ".join(region.name for region in results.regions),
        "change (--since)": None
        if since is None
        else (since.ref, since.commit, since.path, since.old_path, since.lines, since.deletions),
        "number of shards": shard.count,
        "mutants of the run": shard.run,
        "equivalents records of the run": shard.equivalents,
        "test durations the mutants were dealt by": shard.costs,
    }


def _same_baseline(first: Part, other: Part) -> None:
    """What the baseline decides, and so every shard computes alike."""
    mine, theirs = _baseline_of(first.document), _baseline_of(other.document)
    for what, value in mine.items():
        if theirs.get(what) != value:
            raise ConfigError(
                f"shard {other.shard} differs from shard {first.shard} in {what}, which "
                "the baseline decides alike in every shard",
                details={
                    "files": f"{first.path}, {other.path}",
                    "next": "the shards ran on other code or tests (or a baseline that "
                    "differs between runs): run every shard again from one commit",
                },
            )


_TALLY = frozenset((*TALLY_FIELDS, *LATER_TALLY_FIELDS))


def _baseline_of(document: dict[str, Any]) -> dict[str, object]:
    parts: dict[str, object] = {
        f"regions.{name}": {k: v for k, v in body.items() if k not in _TALLY}
        for name, body in document["regions"].items()
    }
    return parts | {
        "tests": document["tests"],
        "source.functions": document["source"]["functions"],
        "catalogue": document.get("catalogue", []),
        "findings": document.get("findings", []),
        "out_of_region": document.get("out_of_region", []),
    }


def _dealt_once(parts: Sequence[Part]) -> None:
    """Each mutant of the run in exactly one shard (shards that each timed their own
    baseline deal differently)."""
    owner: dict[str, Part] = {}
    for part in parts:
        for mutant_id in part.shard.mutants:
            if mutant_id in owner:
                raise ConfigError(
                    f"mutant {mutant_id} was dealt to shard {owner[mutant_id].shard} and to "
                    f"shard {part.shard}",
                    details={"files": f"{owner[mutant_id].path}, {part.path}", "next": _ONE_RUN},
                )
            owner[mutant_id] = part
    missing = [mutant_id for mutant_id in parts[0].shard.run if mutant_id not in owner]
    if missing:
        raise ConfigError(
            f"{len(missing)} mutants of the run were dealt to no shard (first: {missing[0]})",
            details={"next": _ONE_RUN},
        )


def _equivalents(parts: Sequence[Part]) -> list[dict[str, Any]]:
    """The shards' equivalents records in the run's order (``shard.equivalents``).

    A shard lists the records of its own mutants, and every record whose mutant is
    not in the run (the same in every shard); so each shard's list follows the run's
    order, and is walked alongside it."""
    lists = [part.document["equivalents"] for part in parts]
    at = [0] * len(parts)
    merged: list[dict[str, Any]] = []
    for record_id in parts[0].shard.equivalents:
        holders = [n for n, records in enumerate(lists) if _id_at(records, at[n]) == record_id]
        if not holders:
            raise ConfigError(
                f"no shard lists the equivalents record {record_id}",
                details={"next": _ONE_RUN},
            )
        record = lists[holders[0]][at[holders[0]]]
        for n in holders:
            if lists[n][at[n]] != record:
                raise ConfigError(
                    f"shards {parts[holders[0]].shard} and {parts[n].shard} disagree on "
                    f"the equivalents record {record_id}",
                    details={
                        "files": f"{parts[holders[0]].path}, {parts[n].path}",
                        "next": _ONE_RUN,
                    },
                )
            at[n] += 1
        merged.append(record)
    for n, records in enumerate(lists):
        if at[n] != len(records):
            raise ConfigError(
                f"shard {parts[n].shard} lists the equivalents record "
                f"{records[at[n]]['id']} out of the run's order",
                details={"file": str(parts[n].path), "next": _ONE_RUN},
            )
    return merged


def _id_at(records: list[dict[str, Any]], index: int) -> object:
    return records[index]["id"] if index < len(records) else None


def _shown(value: object) -> str:
    """A value of :func:`_run_of`, short enough for one line."""
    if value is None:
        return "none"
    if isinstance(value, tuple) and all(isinstance(item, str) for item in value):
        more = ", ..." if len(value) > 3 else ""
        return f"{len(value)}: {', '.join(value[:3])}{more}"
    return str(value)

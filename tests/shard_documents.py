"""Shards' results made by hand from a whole run's (``tests/unit/data/results.json``),
as ``fence-audit mutate --shard K/N`` writes them, for merge's tests to put back
together and to spoil one field at a time."""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from audit.mutation.scope import APART, OUTSIDE_REGIONS

DATA = Path(__file__).parent / "unit" / "data" / "results.json"
COSTS = "c0" * 32  # the digest of the durations every shard dealt by
ABSENT = "Fence.register:gone@1:0-1:1#0"  # an equivalents record whose mutant is not in the run


def whole_run() -> dict[str, Any]:
    """The hand-written run (9 mutants, regions population and removal), with an
    equivalents record whose mutant it does not have, and its tallies as written."""
    document: dict[str, Any] = json.loads(DATA.read_text())
    document["equivalents"].append(
        {"id": ABSENT, "state": "absent", "reason": "Gone since.", "reviewed": "2026-11-30"}
    )
    return retally(document)


def whole_module() -> dict[str, Any]:
    """The run at ``--scope file``: the removal region's mutmut mutants fall in the group
    outside every region, scored apart."""
    document = whole_run()
    document["scope"] = "file"
    removal = document["regions"]["removal"]
    document["regions"][OUTSIDE_REGIONS] = {**removal, "description": "outside the regions"}
    for mutant in document["mutants"]:
        if mutant["region"] == "removal" and mutant["origin"] == "mutmut":
            mutant["region"] = OUTSIDE_REGIONS
    return retally(document)


def run_ids() -> list[str]:
    return [m["id"] for m in whole_run()["mutants"]]


def retally(document: dict[str, Any]) -> dict[str, Any]:
    """Store the tallies the mutants make (overall, then per region)."""

    def tally(mutants: list[dict[str, Any]]) -> dict[str, Any]:
        counts = Counter(m["status"] for m in mutants)
        judged = counts["killed"] + counts["survived"] + counts["timeout"]
        return {
            **{s: counts[s] for s in ("killed", "survived", "timeout", "no_tests", "error")},
            "equivalent": counts["equivalent"],
            "judged": judged,
            "score": round(100 * counts["killed"] / judged, 2) if judged else None,
            "killed_by_vllm": sum(
                m["status"] == "killed" and not (m["killed_by"] or "").startswith("project/")
                for m in mutants
            ),
        }

    document["score"] = tally([m for m in document["mutants"] if m["region"] not in APART])
    for name, region in document["regions"].items():
        region.update(tally([m for m in document["mutants"] if m["region"] == name]))
    return document


def split(document: dict[str, Any], deal: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
    """One shard's document per list of ``deal`` (mutant ids): its mutants, the
    equivalents records of its mutants and the absent ones, its tallies, its marker;
    shard K started K seconds into the minute and took K seconds."""
    run = [m["id"] for m in document["mutants"]]
    records = [e["id"] for e in document["equivalents"]]
    shards = []
    for index, dealt in enumerate(deal, 1):
        part = copy.deepcopy(document)
        part["mutants"] = [m for m in part["mutants"] if m["id"] in dealt]
        part["equivalents"] = [
            e for e in part["equivalents"] if e["id"] in dealt or e["state"] == "absent"
        ]
        part["started_at"] = f"2026-12-01T10:00:0{index}+00:00"
        part["duration_s"] = float(index)
        part["shard"] = {
            "index": index,
            "count": len(deal),
            "mutants": [i for i in run if i in dealt],
            "run": run,
            "equivalents": records,
            "costs": COSTS,
        }
        shards.append(retally(part))
    return shards


def save(folder: Path, documents: Iterable[dict[str, Any]]) -> list[Path]:
    """Each document as ``folder/shard-K/audit.json``, as CI downloads them."""
    paths = []
    for number, document in enumerate(documents, 1):
        path = folder / f"shard-{number}" / "audit.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document))
        paths.append(path)
    return paths


# A deal of the run over three shards: mutmut's and the catalogue's mixed, every status.
THREE = (
    (
        "Fence.register:swap_op@3:15-3:24#0",
        "Fence.remove:loop@2:8-2:30#0",
        "catalogue:removal-early",
    ),
    (
        "Fence.register:swap_op@3:29-3:36#1",
        "Fence.remove:swap_op@3:15-3:24#0",
        "Fence.remove:string@1:0-1:2#0",
    ),
    (
        "catalogue:population-deleted-registration",
        "Fence.remove:number@5:24-5:25#0",
        "Fence.register:number@5:28-5:29#0",
    ),
)

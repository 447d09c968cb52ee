"""The saved results read back: ``audit.json`` into the results view, checked.

``load_results`` reads ``reports/audit.json`` (format 3, or 2) into the frozen dataclasses
of :mod:`audit.results.view`, so the renderers (:mod:`audit.rendering.reports` lists them)
and the gate (:mod:`audit.results.gate`) never re-run anything and never touch raw JSON. A
missing, corrupt or foreign file is a :class:`ConfigError` that says which file and
what to do. Every field is type-checked and every count and score recomputed from the
mutants (:mod:`audit.results.schema`): the view holds only recomputed tallies, and a
file whose stored tallies disagree with its mutants is refused, naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

from audit.core.protocol import MutantStatus
from audit.mutation.changes import OUTSIDE
from audit.mutation.scope import APART, FILE, OUTSIDE_REGIONS, REGIONS, SCOPES
from audit.results.schema import (
    Fields,
    Invalid,
    Mismatch,
    check_tallies,
    choice,
    count,
    items,
    member,
    read_results,
    stored_tally,
    text,
)
from audit.results.scores import Tally
from audit.results.shards import MOST_SHARDS
from audit.results.view import (
    STATUS_ORDER,
    AuditResults,
    CatalogueRecord,
    ChangeRecord,
    EquivalentRecord,
    FindingRecord,
    FunctionTally,
    MutantRecord,
    RegionResult,
    SecondJudgement,
    ShardRecord,
    SourceFunction,
    SourceLine,
    tally_of,
)
from audit.setup.model import Fraction
from audit.setup.region_specs import REGION_NAME

# This module's names, and the view's that audit/cli.py, audit/commands.py and
# audit/rendering/html_report.py import from here.
__all__ = [
    "CATALOGUE_STATES",
    "STATUS_ORDER",
    "AuditResults",
    "FunctionTally",
    "MutantRecord",
    "RegionResult",
    "SecondJudgement",
    "SourceFunction",
    "SourceLine",
    "by_random",
    "load_results",
]


def load_results(path: Path) -> AuditResults:
    """``audit.json`` at ``path`` as the view, its tallies recomputed from its mutants."""
    return read_results(path, lambda document: _results(path, document))


def _results(path: Path, document: Fields) -> AuditResults:
    by_index = document.count("format") >= 3  # format 2 names the mutants' tests
    bodies = document.mapping("regions")
    if not bodies:
        raise Invalid("regions", "no region (every run judges at least one)")
    names = tuple(name for name, _ in bodies)
    for name in names:  # each names a page of the reports: regions/NAME.html
        if not REGION_NAME.fullmatch(name):
            raise Invalid(f"regions.{name}", "not a region name (letters, digits, '_', '-', '.')")
    tests = document.texts("tests")
    mutants = tuple(
        _mutant(body, names, tests if by_index else None) for body in document.objects("mutants")
    )
    _check_unique(mutants)
    # Every tally is recomputed from the mutants; the stored ones must agree.
    tallies = {f"regions.{n}": tally_of([m for m in mutants if m.region == n]) for n in names}
    tallies["score"] = tally_of([m for m in mutants if m.region not in APART])  # scored apart
    stored = {f"regions.{name}": stored_tally(body) for name, body in bodies}
    overall = document.object("score")
    stored["score"] = stored_tally(overall)
    since = _since(document, names, mutants, stored, tallies)
    scope = choice(document.raw("scope", REGIONS), "scope", SCOPES)
    if OUTSIDE_REGIONS in names and scope != FILE:
        raise Invalid(f"regions.{OUTSIDE_REGIONS}", "only a run of --scope file has this group")
    random_workloads = document.texts("random_workloads", optional=True)
    regions = tuple(
        _region(name, body, tallies[f"regions.{name}"], by_random(mutants, name, random_workloads))
        for name, body in bodies
    )
    tool, target = document.object("tool"), document.object("target")
    suite = document.object("suite", optional=True)
    out_of_region = document.objects("out_of_region", optional=True)
    equivalents = tuple(_equivalent(e) for e in document.objects("equivalents", optional=True))
    incomplete = _incomplete(document, len(mutants))
    results = AuditResults(
        path=path,
        tool_version=tool.text("version"),
        tool_name=tool.text("name", "fence-audit"),
        vllm_version=document.text("vllm_version"),
        target_module=target.text("module"),
        target_path=target.text("path"),
        target_sha256=target.text("sha256"),
        suite_origin=suite.text("tests_from", ""),
        suite_paths=suite.texts("paths", optional=True),
        engine=document.text("engine", ""),
        started_at=document.text("started_at", ""),
        duration_s=document.number("duration_s", 0.0),
        overall=tallies["score"][0],
        regions=regions,
        mutants=mutants,
        functions=_source(document.object("source"), tests),
        out_of_region=len([_out_of_region(body) for body in out_of_region]),
        catalogue=tuple(_catalogue(c) for c in document.objects("catalogue", optional=True)),
        equivalents=equivalents,
        overall_killed_by_vllm=tallies["score"][1],
        incomplete=incomplete,
        since=since,
        findings=tuple(_finding(f) for f in document.objects("findings", optional=True)),
        scope=scope,
        shard=_shard(document, mutants, equivalents, incomplete),
        random_workloads=random_workloads,
        deep_look=_deep_look(document, mutants),
    )
    for part in (overall, tool, target, suite, document):
        part.close()
    check_tallies(stored, tallies)
    return results


def by_random(
    mutants: Sequence[MutantRecord], region: str, workloads: tuple[str, ...]
) -> int | None:
    """How many of ``region``'s mutants the random workloads alone killed; None when
    the run did not measure them. A mutant without a judgement of theirs there is
    refused: the file would claim a measure it does not hold."""
    if not workloads or region in APART:  # the groups outside the fence: not judged
        return None
    mine = [m for m in mutants if m.region == region]
    missing = next((m for m in mine if m.random is None), None)
    if missing is not None:
        raise Invalid(
            f"mutants[{mutants.index(missing)}].random",
            "missing: the run judged every fence mutant by the random workloads alone",
        )
    return sum(m.killed_by_random for m in mine)


def _region(
    name: str, body: Fields, recomputed: tuple[Tally, int], killed_by_random: int | None = None
) -> RegionResult:
    region = RegionResult(
        name=name,
        description=body.text("description", ""),
        functions=body.texts("functions", optional=True),
        tally=recomputed[0],
        lines=_fraction(body, "lines"),
        branches=_fraction(body, "branches"),
        missed_lines=tuple(count(n, w) for w, n in _items(body, "missed_lines")),
        killed_by_vllm=recomputed[1],
        absent=body.texts("absent", optional=True),
        killed_by_random=killed_by_random,
    )
    body.count("tests", 0)  # how many baseline tests touch the region (not shown)
    body.close()
    return region


def _items(body: Fields, key: str) -> list[tuple[str, object]]:
    return items(body.raw(key, []), body.where(key))


def _fraction(body: Fields, key: str) -> Fraction:
    """Line or branch coverage; absent or empty (a region the baseline did not
    measure) is 0 of 0."""
    if body.raw(key, None) in (None, {}):
        return Fraction(0, 0)
    part = body.object(key)
    fraction = Fraction(part.count("covered"), part.count("total"))
    part.close()
    if fraction.covered > fraction.total:
        raise Invalid(part.where("covered"), f"{fraction.covered} is more than the total")
    return fraction


def _mutant(body: Fields, regions: tuple[str, ...], tests: Sequence[str] | None) -> MutantRecord:
    """A mutant; ``tests``: the file's, which its tests index (None: format 2, which
    names them)."""
    region = body.text("region")
    if region not in regions:
        raise Invalid(body.where("region"), f"{region!r} is not in regions ({', '.join(regions)})")
    mutant = MutantRecord(
        id=body.text("id"),
        region=region,
        origin=choice(body.raw("origin"), body.where("origin"), ("mutmut", "catalogue")),
        function=body.text("function"),
        operator=body.text("operator"),
        line=count(body.raw("line"), body.where("line"), minimum=1),
        status=member(body.raw("status"), body.where("status"), MutantStatus),
        killed_by=body.text("killed_by", "", null=True),
        failure=body.text("failure", "", null=True),
        covered_by=_tests(body, "covered_by", tests),
        tests_run=len(_tests(body, "tests_run", tests)),
        duration_s=body.number("duration_s", 0.0),
        diff=body.text("diff", ""),
        cached=body.flag("cached", False),
        hung=body.texts("hung", optional=True),
        lines=tuple(count(n, w, minimum=1) for w, n in _items(body, "lines")),
        random=_second(body.object("random")) if body.has("random") else None,
        deep=_second(body.object("deep")) if body.has("deep") else None,
        **{key: body.text(key, "") for key in _MUTANT_TEXTS},
    )
    body.close()
    return mutant


def _deep_look(document: Fields, mutants: Sequence[MutantRecord]) -> tuple[str, float] | None:
    """``deep``: the deep look's profile and seconds; every survivor of the fence has
    its deep verdict, and no other mutant has one."""
    looked = [(n, m) for n, m in enumerate(mutants) if m.deep is not None]
    if not document.has("deep"):
        if looked:
            raise Invalid(f"mutants[{looked[0][0]}].deep", "the run has no deep look")
        return None
    body = document.object("deep")
    look = (body.text("profile"), body.number("seconds"))
    body.close()
    for number, mutant in enumerate(mutants):
        survivor = mutant.status is MutantStatus.SURVIVED and mutant.region not in APART
        if survivor and mutant.deep is None:
            raise Invalid(f"mutants[{number}].deep", "missing: the run looked at every survivor")
        if mutant.deep is not None and not survivor:
            raise Invalid(f"mutants[{number}].deep", "only a survivor of the fence has one")
    return look


def _second(body: Fields) -> SecondJudgement:
    judgement = SecondJudgement(
        status=member(body.raw("status"), body.where("status"), MutantStatus),
        killed_by=body.text("killed_by", "", null=True),
        failure=body.text("failure", "", null=True),
        duration_s=body.number("duration_s", 0.0),
    )
    body.close()
    return judgement


# Optional text fields of a mutant (see MutantRecord).
_MUTANT_TEXTS = (
    *("module", "path", "equivalence", "title", "invariant", "expected"),
    *("verdict", "bug", "symptom", "history"),
)


def _check_unique(mutants: Sequence[MutantRecord]) -> None:
    first: dict[str, int] = {}
    for number, mutant in enumerate(mutants):
        if mutant.id in first:
            raise Invalid(
                f"mutants[{number}].id", f"{mutant.id!r} is also mutants[{first[mutant.id]}]"
            )
        first[mutant.id] = number


def _source(source: Fields, tests: tuple[str, ...]) -> tuple[SourceFunction, ...]:
    source.text("path", "")
    functions = tuple(_function(body, tests) for body in source.objects("functions"))
    source.close()
    return functions


def _function(body: Fields, tests: tuple[str, ...]) -> SourceFunction:
    function = SourceFunction(
        name=body.text("name"),
        start=body.count("start"),
        end=body.count("end"),
        regions=body.texts("regions"),
        lines=tuple(_line(line, tests) for line in body.objects("lines")),
    )
    body.close()
    return function


def _line(body: Fields, tests: tuple[str, ...]) -> SourceLine:
    coverage = body.raw("coverage")
    region = body.raw("region")
    line = SourceLine(
        number=body.count("n"),
        text=body.text("text"),
        coverage=None if coverage is None else choice(coverage, body.where("coverage"), _COVERED),
        region=None if region is None else text(region, body.where("region")),
        tests=tuple(tests[_test_index(i, where, len(tests))] for where, i in _items(body, "tests")),
    )
    body.close()
    return line


_COVERED = ("covered", "partly", "missed")


def _tests(body: Fields, key: str, tests: Sequence[str] | None) -> tuple[str, ...]:
    """A mutant's list of tests: names (format 2), or indices into the file's tests."""
    if tests is None:
        return body.texts(key, optional=True)
    return tuple(tests[_test_index(i, where, len(tests))] for where, i in _items(body, key))


def _test_index(value: object, where: str, known: int) -> int:
    index = count(value, where)
    if index >= known:
        raise Invalid(where, f"test index {index} is out of range (the file lists {known} tests)")
    return index


def _out_of_region(body: Fields) -> str:
    body.text("function")
    body.count("line")
    identifier = body.text("id")
    body.close()
    return identifier


def _finding(body: Fields) -> FindingRecord:
    record = FindingRecord(
        id=body.text("id"),
        title=body.text("title"),
        doc=body.text("doc"),
        releases=body.texts("releases"),
        tests=body.texts("tests"),
        left_out=body.texts("left_out", optional=True),
    )
    body.close()
    return record


CATALOGUE_STATES = ("applied", "stale", "carried", "not yet")


def _catalogue(body: Fields) -> CatalogueRecord:
    record = CatalogueRecord(
        id=body.text("id"),
        region=body.text("region"),
        title=body.text("title"),
        invariant=body.text("invariant"),
        expected=body.text("expected"),
        file=body.text("file"),
        state=choice(body.raw("state"), body.where("state"), CATALOGUE_STATES),
        reason=body.text("reason", ""),
    )
    body.close()
    return record


_EQUIVALENT_STATES = ("applied", "expired", "killed", "not survived", "absent")


def _equivalent(body: Fields) -> EquivalentRecord:
    record = EquivalentRecord(
        id=body.text("id"),
        state=choice(body.raw("state"), body.where("state"), _EQUIVALENT_STATES),
        reason=body.text("reason"),
        reviewed=body.text("reviewed", ""),
    )
    body.close()
    return record


def _since(
    document: Fields,
    regions: tuple[str, ...],
    mutants: tuple[MutantRecord, ...],
    stored: dict[str, dict[str, object]],
    tallies: dict[str, tuple[Tally, int]],
) -> ChangeRecord | None:
    """``since`` of a pull-request run (None for a run of the whole fence); its score is
    recomputed from every mutant, and checked with the other tallies."""
    if document.raw("since", None) is None:
        if OUTSIDE in regions:
            raise Invalid(f"regions.{OUTSIDE}", "only a pull-request run (since) has this group")
        return None
    body = document.object("since")
    score = body.object("score")
    stored["since.score"] = stored_tally(score)
    tallies["since.score"] = tally_of(mutants)
    old_path = body.raw("old_path", None)
    record = ChangeRecord(
        ref=body.text("ref"),
        commit=_commit(body.raw("commit"), body.where("commit")),
        path=body.text("path"),
        old_path="" if old_path is None else text(old_path, body.where("old_path")),
        lines=tuple(_run(value, where) for where, value in _items(body, "lines")),
        deletions=tuple(count(n, w) for w, n in _items(body, "deletions")),
        tally=tallies["since.score"][0],
        killed_by_vllm=tallies["since.score"][1],
    )
    if not record.ref:
        raise Invalid(body.where("ref"), "empty")
    for number, (before, after) in enumerate(pairwise(record.lines), 1):
        if after[0] <= before[1]:
            where = f"{body.where('lines')}[{number}]"
            raise Invalid(where, "overlaps or precedes the run before it")
    for part in (score, body):
        part.close()
    return record


def _commit(value: object, where: str) -> str:
    sha = text(value, where)
    if not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", sha):
        raise Invalid(where, f"{sha!r} is not a full commit sha")
    return sha


def _run(value: object, where: str) -> tuple[int, int]:
    """A ``[first, last]`` run of changed lines."""
    bounds = items(value, where)
    if len(bounds) != 2:
        raise Invalid(where, f"expected [first, last], got {len(bounds)} numbers")
    first, last = (count(n, w, minimum=1) for w, n in bounds)
    if first > last:
        raise Invalid(where, f"first line {first} is after last line {last}")
    return first, last


def _shard(
    document: Fields,
    mutants: tuple[MutantRecord, ...],
    equivalents: tuple[EquivalentRecord, ...],
    incomplete: tuple[int, int] | None,
) -> ShardRecord | None:
    """``shard`` of one shard's results (None for a whole run): the file holds exactly
    the mutants dealt to it (those judged, if it was interrupted), each once in the
    run, and only records of the run's equivalents."""
    if document.raw("shard", None) is None:
        return None
    body = document.object("shard")
    record = ShardRecord(
        index=body.count("index"),
        count=body.count("count"),
        mutants=body.texts("mutants"),
        run=body.texts("run"),
        equivalents=body.texts("equivalents"),
        costs=body.text("costs"),
    )
    body.close()
    if record.count > MOST_SHARDS:
        raise Invalid(body.where("count"), f"{record.count} is more than {MOST_SHARDS} shards")
    if not 1 <= record.index <= record.count:
        raise Invalid(body.where("index"), f"{record.index} is not in 1..{record.count}")
    _check_once(record.run, body.where("run"))
    _check_once(record.mutants, body.where("mutants"))
    if not re.fullmatch(r"[0-9a-f]{64}", record.costs):
        raise Invalid(body.where("costs"), f"{record.costs!r} is not a sha256 digest")
    run = set(record.run)
    for number, mutant_id in enumerate(record.mutants):
        if mutant_id not in run:
            where = f"{body.where('mutants')}[{number}]"
            raise Invalid(where, f"{mutant_id!r} is not in the run (shard.run)")
    dealt = set(record.mutants)
    for number, mutant in enumerate(mutants):
        if mutant.id not in dealt:
            raise Invalid(f"mutants[{number}].id", f"{mutant.id!r} was not dealt to shard {record}")
    held = {mutant.id for mutant in mutants}
    missing = [mutant_id for mutant_id in record.mutants if mutant_id not in held]
    if incomplete is None and missing:
        raise Invalid(
            body.where("mutants"),
            f"{len(missing)} mutants dealt to this shard are not in the file ({missing[0]!r}, ...)",
        )
    if incomplete is not None and incomplete[1] != len(record.mutants):
        raise Mismatch([("incomplete.of", str(incomplete[1]), str(len(record.mutants)))])
    listed = set(record.equivalents)
    for number, equivalent in enumerate(equivalents):
        if equivalent.id not in listed:
            where = f"equivalents[{number}].id"
            raise Invalid(where, f"{equivalent.id!r} is not in shard.equivalents")
    return record


def _check_once(ids: tuple[str, ...], where: str) -> None:
    first: dict[str, int] = {}
    for number, identifier in enumerate(ids):
        if identifier in first:
            again = f"{identifier!r} is also {where}[{first[identifier]}]"
            raise Invalid(f"{where}[{number}]", again)
        first[identifier] = number


def _incomplete(document: Fields, mutants: int) -> tuple[int, int] | None:
    """``(judged, of)`` of an interrupted run; the file holds exactly the mutants judged."""
    if document.raw("incomplete", None) is None:
        return None
    body = document.object("incomplete")
    judged, total = body.count("judged"), body.count("of")
    body.close()
    if judged > total:
        raise Invalid(body.where("judged"), f"{judged} judged of {total} mutants")
    if judged != mutants:
        raise Mismatch([(body.where("judged"), str(judged), str(mutants))])
    return judged, total

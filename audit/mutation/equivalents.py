"""Reviewed equivalent mutants: survivors no test can kill, each with a written reason.

``mutants/equivalents.toml`` lists them; each verdict names the sha256 of its
function's source as reviewed, and expires when that source changes (the mutant is
then a plain survivor again, and the reports say the verdict expired). The same
mutation in another release's code is another mutant (its id counts lines from the
function's start, and the function may have another name): a verdict's ``[[also]]``
lists those, each with the source it was reviewed against, under the same reason. A mutant
recorded as equivalent that a test kills shows the verdict was wrong: it stays
killed and the reports flag the record.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from audit.core.errors import invalid_file
from audit.core.inputs import known_keys, read_toml
from audit.core.protocol import MutantStatus
from audit.setup.model import Mutant, MutantResult
from audit.setup.regions import Region

_KEYS = {"id", "function_sha256", "reason", "reviewed"}
_SITE_KEYS = {"id", "function_sha256", "reviewed"}


@dataclass(frozen=True, slots=True)
class Site:
    """One mutant a verdict covers, with the function source it was reviewed against."""

    id: str
    function_sha256: str
    reviewed: str


@dataclass(frozen=True, slots=True)
class Equivalent:
    id: str
    function_sha256: str  # of the function's source when the verdict was reviewed
    reason: str
    reviewed: str  # date, and by whom if the project wants it
    also: tuple[Site, ...] = ()  # the same mutation in other releases' code

    @property
    def sites(self) -> tuple[Site, ...]:
        return (Site(self.id, self.function_sha256, self.reviewed), *self.also)


def load_equivalents(path: Path | None) -> tuple[Equivalent, ...]:
    if path is None or not path.is_file():
        return ()
    data = read_toml(path, "the equivalents file")
    records = data.get("equivalent", [])
    if not isinstance(records, list) or set(data) - {"equivalent"}:
        raise invalid_file(
            "the equivalents file holds only [[equivalent]] tables",
            str(path),
            "move anything else out; write each verdict as an [[equivalent]] table",
        )
    out = []
    for number, record in enumerate(records, 1):
        where = f"{path} [[equivalent]] {number}"
        values = _strings(record, _KEYS, _KEYS | {"also"}, where)
        also = record.get("also", [])
        if not isinstance(also, list):
            raise invalid_file(
                "'also' must be a list of [[equivalent.also]] tables",
                where,
                "write each other site as an [[equivalent.also]] table below its verdict",
            )
        sites = tuple(
            Site(**_strings(site, _SITE_KEYS, _SITE_KEYS, f"{where} [[also]] {n}"))
            for n, site in enumerate(also, 1)
        )
        out.append(Equivalent(**values, also=sites))
    _check_listed_once(out, path)
    return tuple(out)


def _check_listed_once(equivalents: list[Equivalent], path: Path) -> None:
    """A mutant (an id, of a function's source) has one verdict: listed twice, the
    reports would list it twice."""
    listed: set[tuple[str, str]] = set()
    for number, equivalent in enumerate(equivalents, 1):
        for site in equivalent.sites:
            key = (site.id, site.function_sha256)
            if key in listed:
                raise invalid_file(
                    f"{site.id} is listed twice for the same source (function_sha256 "
                    f"{site.function_sha256[:12]}...)",
                    f"{path} [[equivalent]] {number}",
                    "keep one verdict for it",
                )
            listed.add(key)


def _strings(record: object, keys: set[str], allowed: set[str], where: str) -> dict[str, str]:
    """``record``'s ``keys``, each a non-empty string; a key outside ``allowed`` is an error."""
    if not isinstance(record, dict):
        raise invalid_file(
            "an [[equivalent]] must be a table", where, "write it as an [[equivalent]] table"
        )
    known_keys(record, allowed, "an [[equivalent]]", file=where)
    values = {key: record.get(key) for key in keys}
    for key, value in values.items():
        if not isinstance(value, str) or not value.strip():
            raise invalid_file(
                f"{key!r} must be a non-empty string",
                where,
                f'write {key} = "..." (see mutants/README.md, "Equivalent mutants")',
            )
    return values  # type: ignore[return-value]


def apply_equivalents(
    mutants: Sequence[Mutant],
    verdicts: Mapping[str, MutantResult],
    function_hashes: Mapping[str, str],
    equivalents: Sequence[Equivalent],
    *,
    left_out: Iterable[Region] = (),
) -> tuple[dict[str, MutantResult], list[dict[str, Any]]]:
    """Survivors with a current verdict become EQUIVALENT, and so do mutants that no
    test reaches (a verdict can say why none can: dead code). Every record gets a
    state: ``applied``, ``expired`` (the function changed), ``killed`` (a test kills
    it: the verdict is wrong), ``not survived`` (another status: timeout, error) or
    ``absent`` (not in the run).

    ``left_out``: the configured regions this run did not judge (``--region``). A
    record whose mutant is not in the run, but may lie in one of them (its function
    is one of theirs; a catalogue entry's region is not known here), is left out of
    the records, as is one whose mutant has no verdict (an interrupted run): this run
    says nothing about it, and only a run that judged it can flag it ``absent``."""
    updated = dict(verdicts)
    records = []
    for equivalent, site, mutant in _in_run(mutants, function_hashes, equivalents, left_out):
        if mutant is not None and mutant.id not in verdicts:
            continue
        state = "absent"
        if mutant is not None:
            status = verdicts[mutant.id].status
            if function_hashes.get(_function_key(mutant)) != site.function_sha256:
                state = "expired"
            elif status in (MutantStatus.SURVIVED, MutantStatus.NO_TESTS):
                state = "applied"
                updated[mutant.id] = replace(verdicts[mutant.id], status=MutantStatus.EQUIVALENT)
            elif status is MutantStatus.KILLED:
                state = "killed"
            else:
                state = "not survived"
        records.append(
            {
                "id": site.id,
                "state": state,
                "reason": equivalent.reason,
                "reviewed": site.reviewed,
            }
        )
    return updated, records


def listed_records(
    mutants: Sequence[Mutant],
    function_hashes: Mapping[str, str],
    equivalents: Sequence[Equivalent],
    *,
    left_out: Iterable[Region] = (),
) -> list[str]:
    """The ids of the records :func:`apply_equivalents` lists once every mutant has a
    verdict, in the file's order: a shard judges only some of the run's mutants, and
    merge puts the shards' records back in this order."""
    return [site.id for _, site, _ in _in_run(mutants, function_hashes, equivalents, left_out)]


def _in_run(
    mutants: Sequence[Mutant],
    function_hashes: Mapping[str, str],
    equivalents: Sequence[Equivalent],
    left_out: Iterable[Region],
) -> Iterator[tuple[Equivalent, Site, Mutant | None]]:
    """Each record this run speaks of, with its site in the run and that site's
    mutant (None: absent); a record absent here that may lie in a region the run left
    out is passed over."""
    by_id = {m.id: m for m in mutants}
    skipped = {function for region in left_out for function in region.functions}
    for equivalent in equivalents:
        site = _site_in_run(equivalent, by_id, function_hashes)
        mutant = by_id.get(site.id)
        if mutant is None and any(_may_lie_in(s.id, skipped) for s in equivalent.sites):
            continue
        yield equivalent, site, mutant


def _site_in_run(
    equivalent: Equivalent, by_id: Mapping[str, Mutant], function_hashes: Mapping[str, str]
) -> Site:
    """The site this run generated whose reviewed source is the run's; else one it
    generated (the verdict has expired); else the verdict's own (absent)."""
    generated = [s for s in equivalent.sites if s.id in by_id]
    for site in generated:
        if function_hashes.get(_function_key(by_id[site.id])) == site.function_sha256:
            return site
    return generated[0] if generated else equivalent.sites[0]


def _function_key(mutant: Mutant) -> str:
    return f"{mutant.module}:{mutant.function}" if mutant.module else mutant.function


def _may_lie_in(mutant_id: str, functions: set[str]) -> bool:
    """Whether the mutant named ``mutant_id`` may belong to a region of ``functions``."""
    function = mutant_id.partition(":")[0]
    if function == "catalogue":  # ``catalogue:ENTRY``: the entry's region is not known here
        return bool(functions)
    return function in functions

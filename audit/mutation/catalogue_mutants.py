"""The catalogue's mutants of a run: each entry of its regions applied, as a mutant.

Applied entries become :class:`~audit.setup.model.Mutant` objects (origin ``catalogue``)
and go through the same executor, cache, statuses, reports and gate as mutmut's; the
stale, carried and not-yet entries are kept, each with its reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from audit.core.protocol import apply_edits
from audit.mutation.catalogue import Carried, NotYet, Stale, apply_entry, outside_region
from audit.mutation.catalogue_entries import Entry
from audit.setup.model import Mutant
from audit.setup.regions import Region


@dataclass(frozen=True, slots=True)
class CatalogueMutants:
    mutants: tuple[Mutant, ...]
    stale: tuple[Stale, ...]
    entries: Mapping[str, Entry]  # by mutant id
    carried: tuple[Carried, ...] = ()  # bugs this release already has
    not_yet: tuple[NotYet, ...] = ()  # entries for code of later releases


def build_catalogue_mutants(
    entries: Iterable[Entry],
    source: str,
    filename: str,
    regions: tuple[Region, ...],
    lines_to_tests: Mapping[int, tuple[str, ...]],
    other_modules: Mapping[str, Path] | None = None,
    all_tests: Iterable[str] = (),
    *,
    version: str | None = None,
    aliases: Mapping[str, tuple[str, ...]] | None = None,
) -> CatalogueMutants:
    """Apply every entry of the named regions; the rest are skipped, stale ones kept.

    An entry for another module than the target (``other_modules`` maps its name to
    its file) has no per-line coverage: the baseline measured the target only, so
    every test of the suite judges it (``all_tests``): slower, never wrong.
    """
    from audit.mutation.mutants import TestsOfLines, unified_diff

    tests_of = TestsOfLines(source, filename, lines_to_tests)
    names = {region.name for region in regions}
    functions = {region.name: region.functions for region in regions}
    mutants: list[Mutant] = []
    stale: list[Stale] = []
    carried: list[Carried] = []
    not_yet: list[NotYet] = []
    by_id: dict[str, Entry] = {}
    everything = tuple(sorted(all_tests))
    for entry in entries:
        if entry.region not in names:
            continue
        by_id[entry.mutant_id] = entry
        module_path = None
        if entry.module:
            module_path = (other_modules or {}).get(entry.module)
            if module_path is None:
                stale.append(Stale(entry, f"module {entry.module} is not installed"))
                continue
        text = module_path.read_text(encoding="utf-8") if module_path else source
        name = str(module_path) if module_path else filename
        applied = apply_entry(entry, text, name, version=version, aliases=aliases)
        if isinstance(applied, Stale):
            stale.append(applied)
            continue
        if isinstance(applied, Carried):
            carried.append(applied)
            continue
        if isinstance(applied, NotYet):
            not_yet.append(applied)
            continue
        outside = outside_region(entry, applied, functions[entry.region])
        if outside is not None:
            stale.append(outside)
            continue
        mutated = apply_edits(text, applied.edits)
        covered = tests_of(applied.changed_lines) if module_path is None else list(everything)
        mutants.append(
            Mutant(
                id=entry.mutant_id,
                origin="catalogue",
                region=entry.region,
                function=applied.function,
                operator=entry.id,
                ordinal=0,
                line=applied.line,
                changed_lines=applied.changed_lines,
                diff=unified_diff(
                    text.splitlines(keepends=True), mutated.splitlines(keepends=True), name
                ),
                edits=applied.edits,
                covered_by=tuple(covered),
                module=entry.module,
                path=str(module_path) if module_path else "",
            )
        )
    return CatalogueMutants(tuple(mutants), tuple(stale), by_id, tuple(carried), tuple(not_yet))

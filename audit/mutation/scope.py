"""Scopes: which of mutmut's mutants of the audited module a run judges.

``regions`` (the default): those of the fence regions' functions that lie in one
region. ``file``: every mutant of the module; the ones outside every region form the
group :data:`OUTSIDE_REGIONS`, reported function by function and scored apart from
the fence (neither in the overall score nor gated, unless a gate threshold names the
group). See DESIGN.md, "Scopes".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from audit.mutation.changes import OUTSIDE, line_ranges
from audit.setup.regions import Region, Span, module_functions

REGIONS = "regions"
FILE = "file"
SCOPES = (REGIONS, FILE)
OUTSIDE_REGIONS = "outside-regions"
# Groups of mutants outside the fence: shown with the regions, scored apart.
APART = frozenset({OUTSIDE, OUTSIDE_REGIONS})


def outside_regions_group(source: str, regions: Iterable[Region]) -> Region:
    """Every line of the module's functions that no region holds, as a group of its own:
    its coverage and its page come with the regions'."""
    inside = {line for region in regions for line in region.lines}
    spans = [
        Span(name, first, last, "outside every region")
        for name, start, end in module_functions(source)
        for first, last in line_ranges(set(range(start, end + 1)) - inside)
    ]
    return Region(
        OUTSIDE_REGIONS,
        "every function of the module, outside the fence regions (--scope file): scored "
        "apart, not in the overall score",
        tuple(sorted(spans, key=lambda span: span.start)),
    )


def all_functions(source: str) -> list[str]:
    return [name for name, _, _ in module_functions(source)]


def placer(
    regions: Iterable[Region], judged: Iterable[str]
) -> Callable[[Iterable[int]], str | None]:
    """A mutant's group from its changed lines: the region holding them all, else
    :data:`OUTSIDE_REGIONS`; None when that region is one the run leaves out."""
    region_of = {line: region.name for region in regions for line in region.lines}
    names = set(judged)

    def place(lines: Iterable[int]) -> str | None:
        owners = {region_of.get(line, "") for line in lines}
        name = owners.pop() if len(owners) == 1 and "" not in owners else OUTSIDE_REGIONS
        return name if name in names else None

    return place

"""The mutants a run judges: its regions, mutmut's mutants of the functions in scope,
the catalogue's entries applied, and the hash of each mutated function.

The scope is the regions' functions, those holding the change (pull-request mode) or
every function of the module (``--scope file``). mutmut's mutations are kept in the
mutations cache, and can be made there before the baseline is in
(:func:`prime_mutations`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from audit.core.environment import InstalledVllm
from audit.mutation import changes
from audit.mutation import scope as scopes
from audit.mutation.catalogue import function_aliases
from audit.mutation.catalogue_entries import Entry
from audit.mutation.catalogue_mutants import CatalogueMutants, build_catalogue_mutants
from audit.mutation.generation import generate_cached
from audit.mutation.mutants import MutantSet, build_mutants, function_hashes
from audit.setup.config import Config
from audit.setup.model import CoverageMap, Mutant, Target
from audit.setup.regions import Region


class PreparedRun(Protocol):
    """What the mutants follow from: a prepared run (:class:`audit.pipeline.Prepared`,
    which this layer cannot import)."""

    @property
    def config(self) -> Config: ...
    @property
    def vllm(self) -> InstalledVllm: ...
    @property
    def target(self) -> Target: ...
    @property
    def regions(self) -> tuple[Region, ...]: ...
    @property
    def catalogue(self) -> tuple[Entry, ...]: ...
    @property
    def changed(self) -> changes.ChangedCode | None: ...
    @property
    def scope(self) -> str: ...


def run_regions(prepared: PreparedRun, only: tuple[str, ...]) -> tuple[Region, ...]:
    """The regions a run judges: all, or those named in ``only`` (--region); in
    pull-request mode the group of the changed code outside them always."""
    return tuple(
        r
        for r in prepared.regions
        if not only or r.name in only or (prepared.changed and r.name == changes.OUTSIDE)
    )


def mutated_functions(
    prepared: PreparedRun, source: str, regions: tuple[Region, ...]
) -> tuple[str, ...]:
    """The functions whose mutmut mutants a run judges: those holding changed lines
    (pull-request mode), every function of the module (``--scope file``), or the
    functions of ``regions``."""
    if prepared.changed is not None:
        return changes.functions_holding(source, prepared.changed.lines)
    if prepared.scope == scopes.FILE:
        return tuple(scopes.all_functions(source))
    return tuple(sorted({f for region in regions for f in region.functions}))


def mutmut_mutants(
    prepared: PreparedRun,
    regions: tuple[Region, ...],
    source: str,
    lines_to_tests: dict[int, tuple[str, ...]],
) -> MutantSet:
    if prepared.changed is not None:
        return _changed_mutants(prepared, regions, source, lines_to_tests)
    place = None  # each mutant in its region
    if prepared.scope == scopes.FILE:  # what no region holds goes apart
        fence = tuple(r for r in prepared.regions if r.name != scopes.OUTSIDE_REGIONS)
        place = scopes.placer(fence, (r.name for r in regions))
    return build_mutants(
        source,
        str(prepared.target.path),
        regions,
        lines_to_tests,
        functions=mutated_functions(prepared, source, regions),
        place=place,
        cache_dir=mutations_cache(prepared.config),
    )


def _changed_mutants(
    prepared: PreparedRun,
    regions: tuple[Region, ...],
    source: str,
    lines_to_tests: dict[int, tuple[str, ...]],
) -> MutantSet:
    """Pull-request mode: mutmut's mutants of the functions holding changed lines, kept
    when they lie on one, in their region (one of ``regions``) or in changes.OUTSIDE."""
    changed = prepared.changed
    assert changed is not None
    fence = tuple(r for r in prepared.regions if r.name != changes.OUTSIDE)
    return build_mutants(
        source,
        str(prepared.target.path),
        regions,
        lines_to_tests,
        functions=mutated_functions(prepared, source, regions),
        place=changes.placer(changed, fence, (r.name for r in regions)),
        near=changed.lines,
        cache_dir=mutations_cache(prepared.config),
    )


def prime_mutations(prepared: PreparedRun) -> None:
    """Make mutmut's mutations of every function a run of ``prepared`` may judge, into
    the mutations cache, so that :func:`mutmut_mutants` reads them back. Generation
    needs no baseline, so this runs while the baseline's test process imports vLLM:
    on a cold cache, seconds of the parent's work off the run's critical path."""
    source = prepared.target.path.read_text(encoding="utf-8")
    # every region's: --region only narrows which of them are judged
    functions = mutated_functions(prepared, source, prepared.regions)
    generate_cached(source, functions, mutations_cache(prepared.config))


def mutations_cache(config: Config) -> Path:
    """Where mutmut's mutations of each function are kept, by the function's text."""
    return config.cache_dir / "mutations"


def catalogue_mutants(
    prepared: PreparedRun,
    coverage_map: CoverageMap,
    regions: tuple[Region, ...],
    source: str,
    others: Mapping[str, Path],
) -> CatalogueMutants:
    """The catalogue's entries of ``regions`` applied (in pull-request mode, those on
    the change); ``others``: the files of the other modules entries name."""
    entries = build_catalogue_mutants(
        prepared.catalogue,
        source,
        str(prepared.target.path),
        regions,
        coverage_map.lines,
        others,
        coverage_map.durations,
        version=prepared.vllm.version,
        aliases=function_aliases(prepared.config.regions),
    )
    if prepared.changed is not None:
        entries = changes.changed_catalogue(entries, prepared.changed)
    return entries


def function_hashes_of(
    source: str, mutants: Sequence[Mutant], others: Mapping[str, Path]
) -> dict[str, str]:
    """The sha256 of each mutated function's source: the target's by name, another
    module's as ``module:name``."""
    hashes = function_hashes(source, {m.function for m in mutants if not m.module})
    for module, path in others.items():
        functions = {m.function for m in mutants if m.module == module}
        text = path.read_text(encoding="utf-8")
        hashes.update({f"{module}:{f}": h for f, h in function_hashes(text, functions).items()})
    return hashes

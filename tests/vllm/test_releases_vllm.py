"""The default regions and the catalogue on every vLLM release, from the sdists.

Each release's ``scheduler.py`` (and ``worker.py``) is read from its sdist on the
package index, fetched once into the cache: no release is installed. The regions
must resolve on every one, with only the parts a release does not have yet absent;
every catalogue entry must apply, be carried (the release already has the bug) or be
not yet, never stale.
"""

from __future__ import annotations

import pytest

from audit.core.errors import RegionUnresolved
from audit.mutation import catalogue, catalogue_entries
from audit.setup.config import load_config
from audit.setup.regions import resolve_regions
from audit.setup.sources import sdist_module

pytestmark = pytest.mark.network

RELEASES = ("0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
SCHEDULER = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"
# What the releases do not have yet, as the regions' `since` says (releases.md).
ABSENT = {
    "0.28.0": {
        "population": ["OffloadingConnectorScheduler._build_aligned_boundary_store_jobs"],
        "flush": ["OffloadingConnectorScheduler._update_req_states"],
    },
}
# Catalogue entries, by state, that are not simply applied.
NOT_APPLIED = {
    "0.28.0": {
        "carried": ["flush-collect-after-early-return"],
        "not yet": [
            "flush-no-cow-collection",
            "flush-preemption-includes-new-loads",
            "population-no-boundary-registration",
            "sliding-window-no-reachable-null-skip",
        ],
    },
    **{
        release: {
            "carried": ["flush-collect-after-early-return"],
            "not yet": [
                "flush-preemption-includes-new-loads",
                "sliding-window-no-reachable-null-skip",
            ],
        }
        for release in ("0.29.0", "0.30.0", "0.31.0", "0.32.0")
    },
    "0.33.0": {},
    "0.34.0": {},
}


def read(release: str, module: str = SCHEDULER) -> str:
    config = load_config(None)
    return sdist_module(release, module, index_url=config.index_url, cache_dir=config.cache_dir)


@pytest.mark.parametrize("release", RELEASES)
def test_the_default_regions_resolve_on_every_release(release: str) -> None:
    config = load_config(None)
    regions = resolve_regions(read(release), config.regions, filename="s.py", version=release)
    absent = {r.name: [a.function for a in r.absent] for r in regions if r.absent}
    assert absent == ABSENT.get(release, {})
    for region in regions:
        assert region.lines, region.name


def test_without_the_alternatives_every_broken_anchor_is_listed_at_once() -> None:
    """0.28.0 against the regions as written for 0.33.0 alone (the alternatives and
    `since` dropped): all nine anchors that do not resolve, in one error."""
    config = load_config(None)
    import dataclasses

    bare = tuple(
        dataclasses.replace(
            spec,
            selections=tuple(
                dataclasses.replace(
                    s,
                    alternatives=(),
                    since="",
                    statements=tuple(
                        dataclasses.replace(a, alternatives=(), since="") for a in s.statements
                    ),
                )
                for s in spec.selections
            ),
        )
        for spec in config.regions
    )
    with pytest.raises(RegionUnresolved) as info:
        resolve_regions(read("0.28.0"), bare, filename="s.py", version="0.28.0")
    assert info.value.summary == "9 region anchors do not resolve in s.py (vLLM 0.28.0)"
    assert all("closest:" in v for k, v in info.value.details.items() if k.startswith("anchor"))


@pytest.mark.parametrize("release", RELEASES)
def test_every_catalogue_entry_applies_or_is_carried_or_not_yet(release: str) -> None:
    config = load_config(None)
    assert config.catalogue_dir is not None
    entries = catalogue_entries.load_catalogue(config.catalogue_dir)
    source = read(release)
    regions = resolve_regions(source, config.regions, filename="s.py", version=release)
    functions = {r.name: r.functions for r in regions}
    aliases = catalogue.function_aliases(config.regions)
    states: dict[str, list[str]] = {}
    for entry in entries:
        text = read(release, entry.module) if entry.module else source
        outcome = catalogue.apply_entry(entry, text, "s.py", version=release, aliases=aliases)
        if isinstance(outcome, catalogue.Applied):
            outcome = catalogue.outside_region(entry, outcome, functions[entry.region]) or outcome
        state = {
            catalogue.Applied: "applied",
            catalogue.Carried: "carried",
            catalogue.NotYet: "not yet",
            catalogue.Stale: "stale",
        }[type(outcome)]
        if state != "applied":
            states.setdefault(state, []).append(entry.id)
    assert states == NOT_APPLIED[release]

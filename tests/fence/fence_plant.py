"""Planting a bug in vLLM for one test: a copy of a function of the installed vLLM with
a statement changed, put in its place with pytest's ``monkeypatch`` (the installed file
is not touched). The planted-bug tests of the random workloads, of the liveness checks
and of the hunt use it (:func:`plant`, and the plants more than one file of them
shares); :func:`fixes_touching` says when a fix applied from ``docs/upstream/`` rewrote
the function, so that there is nothing to plant."""

from __future__ import annotations

import inspect
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest
from fence_findings import fixed
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)


def fixes_touching(function: str) -> list[str]:
    """The findings whose fix this vLLM carries (``fixed``) and whose patch changes
    ``function`` (its ``touches`` in docs/upstream/series.toml); none on a release as
    released."""
    series = Path(__file__).resolve().parents[2] / "docs" / "upstream" / "series.toml"
    if not series.is_file():
        return []
    found = []
    for fix in tomllib.loads(series.read_text())["fix"]:
        names = {
            part.strip().removeprefix("a new ").rsplit(".", 1)[-1]
            for touched in fix.get("touches", ())
            for part in touched.split(":", 1)[-1].split(",")
        }
        if function in names and fixed(fix["finding"]):
            found.append(fix["finding"])
    return found


def plant(
    monkeypatch: pytest.MonkeyPatch,
    cls: type,
    name: str,
    old: str,
    new: str,
    *more: tuple[str, str],
) -> None:
    """Replace ``cls.name`` by a copy of its source with ``old`` changed to ``new`` (and
    each further ``(old, new)`` of ``more``), for this test only (the installed file is
    not touched)."""
    function = getattr(cls, name)
    source = textwrap.dedent(inspect.getsource(function))
    for before, after in ((old, new), *more):
        if source.count(before) != 1 and (fixes := fixes_touching(name)):
            # A catalogue bug planted by its statement in vLLM as released: a fix this
            # vLLM carries (docs/upstream/) rewrote that function, so the statement is
            # not there to plant (on a release as released it is, and this asserts it)
            pytest.skip(
                f"{before!r} is not once in {cls.__name__}.{name}, which the applied "
                f"fix of {', '.join(fixes)} changes: nothing to plant"
            )
        assert source.count(before) == 1, f"{before!r} is not once in {cls.__name__}.{name}"
        source = source.replace(before, after)
    namespace: dict[str, Any] = {}
    code = compile(source, inspect.getsourcefile(function) or name, "exec")
    exec(code, function.__globals__, namespace)
    monkeypatch.setattr(cls, name, namespace[name])


def plant_retention_taken_for_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's mask given the default retention where the engine's is periodic (a
    liveness bug only L4, SegmentLiveness, sees)."""
    plant(
        monkeypatch,
        OffloadingConnectorScheduler,
        "_reachable_store_block_mask",
        "retention_interval=self.config.retention_interval,",
        "retention_interval=self.config.retention_interval and 0,",
    )

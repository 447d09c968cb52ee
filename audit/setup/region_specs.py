"""The regions table (``[tool.fence-audit.regions]``): each region's functions, whole or
by some of their statements, as each vLLM release writes them, checked.

:mod:`audit.setup.regions` resolves these specs to line spans in the audited source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from audit.core.errors import ConfigError
from audit.core.inputs import known_keys
from audit.setup.values import expect, release_key, string

StatementPart = Literal["statement", "header"]


@dataclass(frozen=True, slots=True)
class StatementSelector:
    """Statements whose normalised text (or header) contains ``match``.

    ``alternatives`` are tried in order when ``match`` selects nothing: the same code
    as other releases write it. ``since`` is the vLLM release that introduced the
    statement: before it, a statement no alternative finds is *absent*, not an error.
    """

    match: str
    part: StatementPart = "statement"
    containing: str = ""  # and whose whole text (body included) contains this
    alternatives: tuple[str, ...] = ()
    since: str = ""

    @property
    def anchors(self) -> tuple[str, ...]:
        return (self.match, *self.alternatives)


@dataclass(frozen=True, slots=True)
class Selection:
    """A function of the target module, whole or by some of its statements.

    ``alternatives`` name the same function as other releases do, tried in order
    after ``function``; ``since`` as for a statement.
    """

    function: str
    statements: tuple[StatementSelector, ...] = ()
    alternatives: tuple[str, ...] = ()
    since: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return (self.function, *self.alternatives)


@dataclass(frozen=True, slots=True)
class RegionSpec:
    name: str
    description: str
    selections: tuple[Selection, ...]


# A region's name is a file name of the reports (regions/NAME.html) and an anchor:
# letters, digits, '_', '-' and '.', not first.
REGION_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


def parse_regions(table: Any, source: str) -> tuple[RegionSpec, ...]:
    expect(table, dict, "regions", source)
    regions = []
    for name, body in table.items():
        where = f"regions.{name}"
        if not REGION_NAME.fullmatch(name):
            raise ConfigError(
                f"region name {name!r} is not one fence-audit can name a report page after",
                details={
                    "config": source,
                    "next": "name it with letters, digits, '_', '-' and '.' (not first), "
                    "at most 100 characters",
                },
            )
        expect(body, dict, where, source)
        known_keys(body, {"description", "select"}, where, config=source)
        selects = body.get("select", [])
        expect(selects, list, f"{where}.select", source)
        if not selects:
            raise ConfigError(
                f"region {name!r} selects nothing",
                details={"config": source, "next": f"add [[{where}.select]] entries"},
            )
        regions.append(
            RegionSpec(
                name=name,
                description=str(body.get("description", "")),
                selections=tuple(_parse_selection(s, f"{where}.select", source) for s in selects),
            )
        )
    if not regions:
        raise ConfigError(
            "no regions configured",
            details={
                "config": source,
                "next": "add [tool.fence-audit.regions.NAME] tables with [[...select]] entries, "
                "or remove the empty [tool.fence-audit.regions] to keep the built-in regions",
            },
        )
    return tuple(regions)


def _parse_selection(body: Any, where: str, source: str) -> Selection:
    expect(body, dict, where, source)
    known_keys(body, {"function", "statements", "since"}, where, config=source)
    names = _alternatives(body, "function", where, source)
    selectors: list[StatementSelector] = []
    for item in body.get("statements", []):
        if isinstance(item, str):
            selectors.append(StatementSelector(match=item))
            continue
        expect(item, dict, f"{where}.statements", source)
        known_keys(
            item, {"match", "part", "containing", "since"}, f"{where}.statements", config=source
        )
        part = item.get("part", "statement")
        if part not in ("statement", "header"):
            raise ConfigError(
                f"{where}.statements: part must be 'statement' or 'header', not {part!r}",
                details={
                    "config": source,
                    "function": names[0],
                    "next": 'write part = "statement" or part = "header"',
                },
            )
        matches = _alternatives(item, "match", f"{where}.statements", source)
        selectors.append(
            StatementSelector(
                match=matches[0],
                part=part,
                containing=str(item.get("containing", "")),
                alternatives=matches[1:],
                since=_since(item, f"{where}.statements", source),
            )
        )
    return Selection(
        function=names[0],
        statements=tuple(selectors),
        alternatives=names[1:],
        since=_since(body, where, source),
    )


def _alternatives(table: dict[str, Any], key: str, where: str, source: str) -> tuple[str, ...]:
    """A string, or a non-empty list of strings tried in order (the same code as
    different releases write it)."""
    value = table.get(key)
    if isinstance(value, str):
        return (string(table, key, source, where),)
    if isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value):
        return tuple(value)
    raise ConfigError(
        f"{where}.{key} must be a string or a list of strings, not {value!r}",
        details={"config": source, "next": "give the text, or its alternatives in order"},
    )


def _since(table: dict[str, Any], where: str, source: str) -> str:
    value = table.get("since", "")
    if value and release_key(value) is None:
        raise ConfigError(
            f'{where}.since must be a vLLM release such as "0.29.0", not {value!r}',
            details={
                "config": source,
                "next": "give the release that brought the code, or remove since",
            },
        )
    return str(value)

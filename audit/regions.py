"""Regions: named parts of the fence code, resolved against the audited source by AST.

A region is configured as functions (by qualified name) and, inside big functions,
statements (by their text). Resolution turns that into line spans of *this* source
text, so a region survives line shifts between vLLM versions; what no longer
matches is a :class:`RegionUnresolved` naming the region, the function and what was
not found.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from audit.config import RegionSpec, Selection, StatementSelector
from audit.errors import ConfigError, RegionUnresolved

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True, slots=True)
class Span:
    """Lines ``start..end`` (inclusive) of one selected statement or function body."""

    function: str
    start: int
    end: int
    anchor: str  # the selector text that chose it; "" for a whole function

    @property
    def lines(self) -> range:
        return range(self.start, self.end + 1)


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    description: str
    spans: tuple[Span, ...]

    @property
    def functions(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(span.function for span in self.spans))

    @property
    def lines(self) -> frozenset[int]:
        return frozenset(line for span in self.spans for line in span.lines)


def resolve_regions(
    source: str, specs: Iterable[RegionSpec], *, filename: str
) -> tuple[Region, ...]:
    """Resolve every region spec against ``source``; regions must not overlap."""
    tree = ast.parse(source, filename=filename)
    regions = tuple(_resolve_region(tree, spec, filename) for spec in specs)
    _check_disjoint(regions, filename)
    return regions


def find_function(tree: ast.Module, qualname: str) -> FunctionNode | None:
    """The function or method named ``qualname`` (``Class.method``), or None."""
    scope: list[ast.stmt] = tree.body
    found: ast.stmt | None = None
    for part in qualname.split("."):
        found = next(
            (
                node
                for node in scope
                if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and node.name == part
            ),
            None,
        )
        if found is None:
            return None
        scope = found.body
    return found if isinstance(found, ast.FunctionDef | ast.AsyncFunctionDef) else None


def statement_text(stmt: ast.stmt) -> str:
    """Normalised text an anchor is matched against: a compound statement's header only."""
    text = ast.unparse(stmt)
    if _body_of(stmt):
        text = text.split("\n", 1)[0]
    return _normalise(text)


def _resolve_region(tree: ast.Module, spec: RegionSpec, filename: str) -> Region:
    spans: list[Span] = []
    for selection in spec.selections:
        function = find_function(tree, selection.function)
        if function is None:
            raise RegionUnresolved(
                f"region {spec.name!r}: function {selection.function!r} not found",
                details={
                    "source": filename,
                    "next": "update the region's 'function' to the function's current "
                    "qualified name (Class.method)",
                },
            )
        spans.extend(_select(function, selection, spec.name, filename))
    return Region(name=spec.name, description=spec.description, spans=_merge(spans))


def _select(function: FunctionNode, selection: Selection, region: str, filename: str) -> list[Span]:
    body = _without_docstring(function.body)
    if not selection.statements:
        return [Span(selection.function, body[0].lineno, _end(body[-1]), "")]
    spans: list[Span] = []
    for selector in selection.statements:
        matches = _outermost(stmt for stmt in walk_statements(body) if _matches(stmt, selector))
        if not matches:
            also = f" containing {selector.containing!r}" if selector.containing else ""
            raise RegionUnresolved(
                f"region {region!r}: no statement matching {selector.match!r}{also} "
                f"in {selection.function}",
                details={
                    "source": f"{filename}:{function.lineno}",
                    "next": "the code changed: update the anchor in the region's 'statements'",
                },
            )
        spans.extend(_span(stmt, selector, selection.function) for stmt in matches)
    return spans


def _matches(stmt: ast.stmt, selector: StatementSelector) -> bool:
    if _normalise(selector.match) not in statement_text(stmt):
        return False
    return not selector.containing or _normalise(selector.containing) in _normalise(
        ast.unparse(stmt)
    )


def _span(stmt: ast.stmt, selector: StatementSelector, function: str) -> Span:
    body = _body_of(stmt)
    if selector.part == "header" and body:
        return Span(function, stmt.lineno, max(stmt.lineno, body[0].lineno - 1), selector.match)
    return Span(function, stmt.lineno, _end(stmt), selector.match)


def walk_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of ``body``, nested ones included, in source order."""
    for stmt in body:
        yield stmt
        for block in _blocks_of(stmt):
            yield from walk_statements(block)


def first_line(node: FunctionNode) -> int:
    """Where a function's text starts: its first decorator, else its ``def``."""
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])


def _blocks_of(stmt: ast.stmt) -> list[list[ast.stmt]]:
    blocks = [getattr(stmt, name, None) for name in ("body", "orelse", "finalbody")]
    result = [b for b in blocks if isinstance(b, list) and b and isinstance(b[0], ast.stmt)]
    result.extend(handler.body for handler in getattr(stmt, "handlers", []))
    result.extend(case.body for case in getattr(stmt, "cases", []))
    return result


def _body_of(stmt: ast.stmt) -> list[ast.stmt]:
    body = getattr(stmt, "body", None)
    return body if isinstance(body, list) and body and isinstance(body[0], ast.stmt) else []


def _outermost(stmts: Iterable[ast.stmt]) -> list[ast.stmt]:
    """Drop statements nested inside another selected one (the outer covers them)."""
    kept: list[ast.stmt] = []
    for stmt in stmts:  # pre-order: an enclosing statement always comes first
        if not any(k.lineno <= stmt.lineno and _end(stmt) <= _end(k) for k in kept):
            kept.append(stmt)
    return kept


def _merge(spans: list[Span]) -> tuple[Span, ...]:
    """Sort spans and drop any that another span of the region already contains."""
    kept: list[Span] = []
    for span in sorted(spans, key=lambda s: (s.start, -s.end)):
        if not any(k.start <= span.start and span.end <= k.end for k in kept):
            kept.append(span)
    return tuple(kept)


def _check_disjoint(regions: tuple[Region, ...], filename: str) -> None:
    owner: dict[int, str] = {}
    for region in regions:
        for line in sorted(region.lines):
            if line in owner and owner[line] != region.name:
                raise ConfigError(
                    f"regions {owner[line]!r} and {region.name!r} overlap at line {line}",
                    details={
                        "source": f"{filename}:{line}",
                        "next": 'narrow one of the two selections (part = "header" keeps '
                        "a compound statement's header only)",
                    },
                )
            owner[line] = region.name


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0]
    if (
        len(body) > 1
        and isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return body[1:]
    return body


def _end(node: ast.stmt) -> int:
    return node.end_lineno or node.lineno


def _normalise(text: str) -> str:
    """Drop all whitespace: ast.unparse's spacing and a config's spacing may differ."""
    return "".join(text.split())

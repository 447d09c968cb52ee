"""Regions: named parts of the fence code, resolved against the audited source by AST.

A region is configured as functions (by qualified name) and, inside big functions,
statements (by their text). Resolution turns that into line spans of *this* source
text, so a region survives line shifts between vLLM versions; what no longer
matches is a :class:`RegionUnresolved` naming the region, the function and what was
not found.
"""

from __future__ import annotations

import ast
import copy
import difflib
import functools
import keyword
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from audit.core.errors import ConfigError, RegionUnresolved
from audit.setup.region_specs import RegionSpec, Selection, StatementSelector
from audit.setup.values import release_key

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
class Absent:
    """A part of a region this release does not have yet (its ``since`` is later)."""

    function: str
    anchor: str  # "" for a whole function
    since: str

    def __str__(self) -> str:
        what = f"{self.function}: {self.anchor}" if self.anchor else self.function
        return f"{what} (since vLLM {self.since})"


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    description: str
    spans: tuple[Span, ...]
    absent: tuple[Absent, ...] = ()

    @property
    def functions(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(span.function for span in self.spans))

    @property
    def lines(self) -> frozenset[int]:
        return frozenset(line for span in self.spans for line in span.lines)


def resolve_regions(
    source: str, specs: Iterable[RegionSpec], *, filename: str, version: str | None = None
) -> tuple[Region, ...]:
    """Resolve every region spec against ``source`` (of vLLM ``version``, when known);
    regions must not overlap.

    Every anchor is tried before anything is reported, so one error lists all that do
    not resolve, each with the closest code this source has (exit 6)."""
    tree = ast.parse(source, filename=filename)
    resolver = _Resolver(tree, version)
    regions = tuple(resolver.region(spec) for spec in specs)
    if resolver.problems:
        count = len(resolver.problems)
        release = f" (vLLM {version})" if version else ""
        details = {f"anchor {n}": problem for n, problem in enumerate(resolver.problems, 1)}
        details["next"] = (
            "add this release's text as an alternative (function = [...] or "
            'match = [...]), or since = "VERSION" for code a release does not have yet; '
            'see docs/design/regions-and-catalogue.md, "Regions that follow the code"'
        )
        raise RegionUnresolved(
            f"{count} region anchor{'s' if count != 1 else ''} do{'es' if count == 1 else ''}"
            f" not resolve in {filename}{release}",
            details=details,
        )
    _check_disjoint(regions, filename)
    return regions


class _Resolver:
    """Resolves regions against one module, collecting what does not resolve."""

    def __init__(self, tree: ast.Module, version: str | None) -> None:
        self.tree = tree
        self.release = release_key(version) if version else None
        self.problems: list[str] = []

    def region(self, spec: RegionSpec) -> Region:
        spans: list[Span] = []
        absent: list[Absent] = []
        for selection in spec.selections:
            found = next(
                (
                    (name, node)
                    for name in selection.names
                    if (node := find_function(self.tree, name)) is not None
                ),
                None,
            )
            if found is None:
                if self._not_yet(selection.since):
                    absent.append(Absent(selection.function, "", selection.since))
                else:
                    self.problems.append(self._no_function(spec.name, selection))
                continue
            name, function = found
            spans.extend(self._select(function, name, selection, spec.name, absent))
        return Region(spec.name, spec.description, _merge(spans), tuple(absent))

    def _select(
        self,
        function: FunctionNode,
        name: str,
        selection: Selection,
        region: str,
        absent: list[Absent],
    ) -> list[Span]:
        body = _without_docstring(function.body)
        if not selection.statements:
            return [Span(name, body[0].lineno, _end(body[-1]), "")]
        spans: list[Span] = []
        for selector in selection.statements:
            anchor, matches = next(
                (
                    (anchor, found)
                    for anchor in selector.anchors
                    if (
                        found := _outermost(
                            s for s in walk_statements(body) if _matches(s, selector, anchor)
                        )
                    )
                ),
                (selector.match, []),
            )
            if matches:
                spans.extend(_span(stmt, selector, name, anchor) for stmt in matches)
            elif self._not_yet(selector.since):
                absent.append(Absent(name, selector.match, selector.since))
            else:
                self.problems.append(_no_statement(region, name, function, selector))
        return spans

    def _not_yet(self, since: str) -> bool:
        """True if this release predates ``since`` (the part is absent, not broken)."""
        introduced = release_key(since) if since else None
        return introduced is not None and self.release is not None and self.release < introduced

    def _no_function(self, region: str, selection: Selection) -> str:
        tried = " or ".join(selection.names)
        qualnames = list(_qualnames(self.tree))
        best = max(qualnames, key=lambda q: _likeness(selection.function, q), default=None)
        closest = ""
        if best is not None:
            node = find_function(self.tree, best)
            closest = f"; closest: {best} (line {node.lineno if node else '?'})"
        return f"{region}: no function {tried}{closest}"


def _no_statement(
    region: str, name: str, function: FunctionNode, selector: StatementSelector
) -> str:
    tried = " or ".join(repr(a) for a in selector.anchors)
    also = f" containing {selector.containing!r}" if selector.containing else ""
    statements = list(walk_statements(_without_docstring(function.body)))
    headers = {id(s): ast.unparse(s).split("\n", 1)[0] for s in statements}
    best = max(statements, key=lambda s: _likeness(selector.match, headers[id(s)]))
    header = headers[id(best)]
    if len(header) > 90:
        header = header[:87] + "..."
    return (
        f"{region}: no statement matching {tried}{also} in {name} (line {function.lineno}); "
        f"closest: {header!r} (line {best.lineno})"
    )


def _likeness(wanted: str, candidate: str) -> float:
    """How alike two texts are (0-1), plus 1 when both open with the same keyword
    (``for``, ``if``, ...): a moved loop is likelier the loop than any assignment."""
    ratio = difflib.SequenceMatcher(None, _normalise(wanted), _normalise(candidate)).ratio()
    return ratio + (_keyword(wanted) is not None and _keyword(wanted) == _keyword(candidate))


def _keyword(text: str) -> str | None:
    word = text.strip().split(" ", 1)[0].rstrip(":")
    return word if keyword.iskeyword(word) else None


def _qualnames(tree: ast.Module) -> Iterator[str]:
    """``Class.method`` and top-level function names of a module."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{node.name}.{item.name}"


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


@functools.cache
def statement_text(stmt: ast.stmt) -> str:
    """Normalised text an anchor is matched against: a compound statement's header only
    (unparsed without its blocks, which can be most of a function)."""
    if not _body_of(stmt):
        return _normalise(ast.unparse(stmt))
    header = copy.copy(stmt)
    for name in ("body", "orelse", "finalbody", "handlers", "cases"):
        if hasattr(header, name):
            setattr(header, name, [ast.Pass()] if name == "body" else [])
    return _normalise(ast.unparse(header).split("\n", 1)[0])


def _matches(stmt: ast.stmt, selector: StatementSelector, anchor: str) -> bool:
    if _normalise(anchor) not in statement_text(stmt):
        return False
    return not selector.containing or _normalise(selector.containing) in _normalise(
        ast.unparse(stmt)
    )


def _span(stmt: ast.stmt, selector: StatementSelector, function: str, anchor: str) -> Span:
    body = _body_of(stmt)
    if selector.part == "header" and body:
        return Span(function, stmt.lineno, max(stmt.lineno, body[0].lineno - 1), anchor)
    return Span(function, stmt.lineno, _end(stmt), anchor)


def walk_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of ``body``, nested ones included, in source order."""
    for stmt in body:
        yield stmt
        for block in _blocks_of(stmt):
            yield from walk_statements(block)


def module_functions(source: str) -> Iterator[tuple[str, int, int]]:
    """(qualified name, first line, last line) of each module function and method of a
    module class, decorators included."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, first_line(node), node.end_lineno or node.lineno
        elif isinstance(node, ast.ClassDef):
            for child in node.body:
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    name = f"{node.name}.{child.name}"
                    yield name, first_line(child), child.end_lineno or child.lineno


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

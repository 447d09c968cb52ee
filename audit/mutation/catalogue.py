"""A catalogue entry applied to a source: anchored on statement text, edited, checked.

Each change of an entry (:mod:`audit.mutation.catalogue_entries`) anchors on a
statement's text (whitespace ignored), never on a line number, so it survives line
shifts between vLLM versions. An entry that no longer applies (its anchor is gone or
ambiguous, its edit no longer matches, the result does not compile or changes nothing)
is STALE, with the reason: never dropped. A release that already has the entry's bug
CARRIES it; a release older than the code the entry changes has it NOT YET.
"""

from __future__ import annotations

import ast
import functools
import itertools
import textwrap
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from audit.core.protocol import LineEdit, apply_edits
from audit.mutation.catalogue_entries import Change, Entry, Shape
from audit.setup.region_specs import RegionSpec
from audit.setup.regions import FunctionNode, find_function, walk_statements
from audit.setup.values import release_key
from audit.testproc.codeswap import find_code


@dataclass(frozen=True, slots=True)
class Stale:
    entry: Entry
    reason: str


@dataclass(frozen=True, slots=True)
class Carried:
    """The release already has the entry's code: it *carries this bug*. Nothing to judge."""

    entry: Entry
    reason: str


@dataclass(frozen=True, slots=True)
class NotYet:
    """The code the entry changes came in a later release (the entry's ``since``)."""

    entry: Entry
    reason: str


@dataclass(frozen=True, slots=True)
class Applied:
    entry: Entry
    edits: tuple[LineEdit, ...]
    changed_lines: tuple[int, ...]  # lines of the original whose statements changed
    function: str
    line: int


def function_aliases(specs: Iterable[RegionSpec]) -> dict[str, tuple[str, ...]]:
    """Each function a region selection names, with the names it has in other releases
    (the selection's alternatives): an entry written for one release finds its
    function in the others without its own list."""
    return {
        name: selection.names
        for spec in specs
        for selection in spec.selections
        for name in selection.names
    }


class _Stale(Exception):
    """Why an entry does not apply to this source."""


def apply_entry(
    entry: Entry,
    source: str,
    filename: str,
    *,
    version: str | None = None,
    aliases: Mapping[str, tuple[str, ...]] | None = None,
) -> Applied | Stale | Carried | NotYet:
    """The entry's edits on ``source`` (of vLLM ``version``, when known), checked: they
    apply, compile and change the code. ``aliases`` give a function's names in other
    releases (:func:`function_aliases`).

    Before the entry's ``since`` it is :class:`NotYet`. When the release already has
    the code every change would write, or does not take the change but has the bug's
    older shape (``carried-when``), it is :class:`Carried`: the release has the bug."""
    outcome = _apply(entry, source, filename, version, aliases or {})
    if isinstance(outcome, Stale | NotYet) and entry.carried_when is not None:
        shape = _has_shape(entry.carried_when, source, filename, aliases or {})
        if shape:
            return Carried(entry, shape)
    return outcome


def _has_shape(
    shape: Shape, source: str, filename: str, aliases: Mapping[str, tuple[str, ...]]
) -> str:
    """Why ``source`` has the bug's older shape ("" if it has not)."""
    tree, _ = _original(source, filename)
    lines = source.splitlines()
    try:
        name, function = _function(Change(shape.function, shape.statement, "delete"), tree, aliases)
        stmt = _find_statement(function, shape.statement, 0, name, lines)
        if not shape.after:
            return f"{name} has {_first(lines[stmt.lineno - 1])!r}"
        after = _find_statement(function, shape.after, 0, name, lines)
    except _Stale:
        return ""
    if stmt.lineno <= (after.end_lineno or after.lineno):
        return ""
    return (
        f"in {name}, {_first(lines[stmt.lineno - 1])!r} comes after "
        f"{_first(lines[after.lineno - 1])!r}"
    )


def _apply(
    entry: Entry,
    source: str,
    filename: str,
    version: str | None,
    aliases: Mapping[str, tuple[str, ...]],
) -> Applied | Stale | Carried | NotYet:
    if entry.since and version and (release_key(version) or ()) < (release_key(entry.since) or ()):
        return NotYet(entry, f"the code it changes came in vLLM {entry.since}")
    try:
        tree, _ = _original(source, filename)
        lines = source.splitlines()
        edits: list[LineEdit] = []
        touched: set[int] = set()
        functions: list[str] = []
        carried: list[str] = []
        for change in entry.changes:
            name, function = _function(change, tree, aliases)
            functions.append(name)
            already = _already_there(change, function, name, lines)
            if already:
                carried.append(already)
                continue
            change_edits, change_lines = _edits(change, function, name, lines)
            edits.extend(change_edits)
            touched.update(change_lines)
        if carried and len(carried) == len(entry.changes):
            return Carried(entry, "; ".join(carried))
        if carried:
            raise _Stale(f"only some of its changes are already in this release: {carried[0]}")
        _check_disjoint(edits)
        mutated = apply_edits(source, tuple(edits))
        _check_changes_code(source, mutated, set(functions), filename)
    except _Stale as why:
        return Stale(entry, str(why))
    return Applied(
        entry=entry,
        edits=tuple(edits),
        changed_lines=tuple(sorted(touched)),
        function=functions[0],
        line=min(touched),
    )


def _function(
    change: Change, tree: ast.Module, aliases: Mapping[str, tuple[str, ...]]
) -> tuple[str, FunctionNode]:
    names = aliases.get(change.function, (change.function,))
    if change.function not in names:
        names = (change.function, *names)
    for name in names:
        function = find_function(tree, name)
        if function is not None:
            return name, function
    raise _Stale(f"function {' or '.join(names)} not found")


def _already_there(change: Change, function: FunctionNode, name: str, lines: list[str]) -> str:
    """Why the release already has what ``change`` would write ("" if it has not).

    A move whose statement already sits right after its new place; an edit whose statement
    already reads ``new`` and not ``old``; a replacement the function already holds;
    an insertion already beside its anchor. A deletion is never carried: a statement
    that is missing may as well have moved."""
    if change.action == "delete":
        return ""
    if change.action == "replace":
        try:
            _find_any(function, change.statements, change.occurrence, name, lines)
        except _Stale:  # the statement to replace is gone: is its replacement there?
            pass
        else:
            return ""
        new = _squash(change.new)
        holder = next(
            (s for s in walk_statements(function.body) if new in _text_of(s, lines)), None
        )
        return f"{name} already has {_first(change.new)!r}" if holder else ""
    stmt = _find_any(function, change.statements, change.occurrence, name, lines)
    if change.action == "edit":
        text = _text_of(stmt, lines)
        if _squash(change.old) not in text and change.new and _squash(change.new) in text:
            line = stmt.lineno - function.lineno
            return f"the statement at {name} line {line} already reads {change.new!r}"
        return ""
    siblings = _siblings(function, stmt)
    if change.action == "move_after":
        target = _find_any(function, change.afters, 0, name, lines)
        index = next(i for i, s in enumerate(siblings) if s is stmt)
        if index > 0 and siblings[index - 1] is target:
            return (
                f"{_first(lines[stmt.lineno - 1])!r} already comes right after "
                f"{_first(lines[target.lineno - 1])!r} in {name}"
            )
        return ""
    index = next(i for i, s in enumerate(siblings) if s is stmt)
    beside = index - 1 if change.action == "insert_before" else index + 1
    if 0 <= beside < len(siblings) and _text_of(siblings[beside], lines) == _squash(change.new):
        return f"{name} already has {_first(change.new)!r} beside the anchor"
    return ""


def _edits(
    change: Change, function: FunctionNode, name: str, lines: list[str]
) -> tuple[list[LineEdit], range | list[int]]:
    """The line edits of one change, and the original lines whose behaviour it touches
    (the anchor statement's; for a move, the destination's too): their tests judge it."""
    stmt = _find_any(function, change.statements, change.occurrence, name, lines)
    start, end = stmt.lineno, stmt.end_lineno or stmt.lineno
    touched = range(start, end + 1)
    indent = _indent(lines[start - 1])
    if change.action == "delete":
        return [LineEdit(start, end, (f"{indent}pass",))], touched
    if change.action == "replace":
        return [LineEdit(start, end, _block(change.new, indent))], touched
    if change.action == "insert_before":
        return [LineEdit(start, start - 1, _block(change.new, indent))], touched
    if change.action == "insert_after":
        return [LineEdit(end + 1, end, _block(change.new, indent))], touched
    if change.action == "edit":
        text = "\n".join(lines[start - 1 : end])
        count = text.count(change.old)
        if count != 1:
            raise _Stale(
                f"{change.old!r} occurs {count} times in the statement at "
                f"{name} line {start - function.lineno}, not once"
            )
        new = tuple(text.replace(change.old, change.new).split("\n"))
        return [LineEdit(start, end, new)], touched
    # move_after
    target = _find_any(function, change.afters, 0, name, lines)
    target_end = target.end_lineno or target.lineno
    if start <= target.lineno <= end or target.lineno <= start <= target_end:
        raise _Stale("move_after: the statement and its new place overlap")
    moved = textwrap.dedent("\n".join(lines[start - 1 : end]))
    edits = [
        LineEdit(start, end, (f"{indent}pass",)),
        LineEdit(target_end + 1, target_end, _block(moved, _indent(lines[target.lineno - 1]))),
    ]
    return edits, [*touched, *range(target.lineno, target_end + 1)]


def _find_any(
    function: FunctionNode,
    anchors: tuple[str, ...],
    occurrence: int,
    qualname: str,
    lines: list[str],
) -> ast.stmt:
    """The statement of the first anchor that finds one; the first anchor's reason if
    none does."""
    first: _Stale | None = None
    for anchor in anchors:
        try:
            return _find_statement(function, anchor, occurrence, qualname, lines)
        except _Stale as why:
            first = first or why
    assert first is not None
    raise first


def _text_of(stmt: ast.stmt, lines: list[str]) -> str:
    return _squash("".join(lines[stmt.lineno - 1 : stmt.end_lineno]))


def _squash(text: str) -> str:
    return "".join(text.split())


def _first(text: str) -> str:
    return text.strip().split("\n", 1)[0]


def _siblings(function: FunctionNode, stmt: ast.stmt) -> list[ast.stmt]:
    """The statement list that holds ``stmt``."""
    for node in [function, *walk_statements(function.body)]:
        for block in (getattr(node, f, None) for f in ("body", "orelse", "finalbody")):
            if isinstance(block, list) and any(s is stmt for s in block):
                return block
        for handler in getattr(node, "handlers", []):
            if any(s is stmt for s in handler.body):
                return list(handler.body)
    return [stmt]


def _find_statement(
    function: FunctionNode, anchor: str, occurrence: int, qualname: str, lines: list[str]
) -> ast.stmt:
    """The innermost statement whose source text contains ``anchor``, whitespace ignored
    (the text as the file spells it, so an anchor is copied from the source)."""
    wanted = "".join(anchor.split())

    def text(stmt: ast.stmt) -> str:
        return "".join("".join(lines[stmt.lineno - 1 : stmt.end_lineno]).split())

    hits = [s for s in walk_statements(function.body) if wanted in text(s)]
    innermost = [s for s in hits if not any(o is not s and _inside(o, s) for o in hits)]
    if not innermost:
        raise _Stale(f"no statement of {qualname} contains {anchor!r}")
    if occurrence:
        if occurrence > len(innermost):
            raise _Stale(
                f"occurrence {occurrence} of {anchor!r} in {qualname}: only {len(innermost)}"
            )
        return innermost[occurrence - 1]
    if len(innermost) > 1:
        where = ", ".join(str(s.lineno - function.lineno) for s in innermost)
        raise _Stale(
            f"{len(innermost)} statements of {qualname} contain {anchor!r} (at lines {where} "
            "from the def): make the anchor longer or give occurrence"
        )
    return innermost[0]


def _inside(inner: ast.stmt, outer: ast.stmt) -> bool:
    """``inner`` lies strictly inside ``outer``."""
    return (
        outer.lineno <= inner.lineno
        and (inner.end_lineno or 0) <= (outer.end_lineno or 0)
        and (inner.lineno, inner.end_lineno) != (outer.lineno, outer.end_lineno)
    )


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _block(text: str, indent: str) -> tuple[str, ...]:
    body = textwrap.dedent(text).strip("\n")
    return tuple(indent + line if line.strip() else "" for line in body.split("\n"))


def _check_disjoint(edits: list[LineEdit]) -> None:
    spans = sorted((e.start, max(e.start - 1, e.end)) for e in edits)
    for (_, a_end), (b_start, _) in itertools.pairwise(spans):
        if b_start <= a_end:
            raise _Stale(f"two changes overlap at line {b_start}")


@functools.lru_cache(maxsize=4)
def _original(source: str, filename: str) -> tuple[ast.Module, types.CodeType]:
    """The audited source parsed and compiled once, for every entry checked against it."""
    return ast.parse(source, filename=filename), compile(source, filename, "exec")


def _check_changes_code(source: str, mutated: str, functions: Iterable[str], filename: str) -> None:
    try:
        compiled = compile(mutated, filename, "exec")
    except SyntaxError as error:
        raise _Stale(
            f"the changed source does not compile: {error.msg} (line {error.lineno})"
        ) from None
    _, original = _original(source, filename)
    for qualname in functions:
        before, after = _code(original, qualname), _code(compiled, qualname)
        if after is None:
            raise _Stale(f"function {qualname} is gone from the changed source")
        if before is not None and _fingerprint(before) == _fingerprint(after):
            raise _Stale(f"the change leaves the code of {qualname} as it was")


def _code(module: types.CodeType, qualname: str) -> types.CodeType | None:
    try:
        return find_code(module, qualname)
    except LookupError:
        return None


def _fingerprint(code: types.CodeType) -> tuple[object, ...]:
    """What a function does, without where it sits (line numbers differ after an edit)."""
    consts = tuple(
        _fingerprint(c) if isinstance(c, types.CodeType) else (type(c).__name__, repr(c))
        for c in code.co_consts
    )
    return (code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars)


def outside_region(entry: Entry, applied: Applied, functions: tuple[str, ...]) -> Stale | None:
    """Stale when an entry of the target changes a function its region does not hold:
    its verdict would count in a region's score for code the region does not audit.

    (An entry for another module, the worker's, names functions no region of the target
    can list; those are judged by every test, see
    :func:`audit.mutation.catalogue_mutants.build_catalogue_mutants`.)"""
    if entry.module or applied.function in functions:
        return None
    return Stale(
        entry,
        f"it changes {applied.function}, which is not in region {entry.region} "
        f"({', '.join(functions)})",
    )

"""The catalogue: hand-written, realistic fence bugs, one TOML file each in ``mutants/``.

mutmut swaps operators; it cannot delete a registration, route a block to the wrong
list or move a check after job creation. A catalogue entry can. Each entry names the
function and anchors every change on a statement's text (whitespace ignored), never on
a line number, so it survives line shifts between vLLM versions. An entry that no
longer applies (its anchor is gone or ambiguous, its edit no longer matches, the
result does not compile or changes nothing) is STALE, with the reason: never dropped.

Applied entries become :class:`~audit.setup.model.Mutant` objects (origin ``catalogue``)
and go through the same executor, cache, statuses, reports and gate as mutmut's.
"""

from __future__ import annotations

import ast
import functools
import itertools
import textwrap
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from audit.core.errors import ConfigError, invalid_file
from audit.core.inputs import known_keys, read_toml
from audit.core.protocol import LineEdit, apply_edits
from audit.setup.config import RegionSpec, release_key
from audit.setup.model import Mutant
from audit.setup.regions import FunctionNode, Region, find_function, walk_statements
from audit.testproc.codeswap import find_code

CATALOGUE_FORMAT = 1
Action = Literal["delete", "replace", "edit", "insert_before", "insert_after", "move_after"]
ACTIONS = ("delete", "replace", "edit", "insert_before", "insert_after", "move_after")
Expected = Literal["vllm", "project", "known-gap"]
EXPECTED = ("vllm", "project", "known-gap")
_ENTRY_KEYS = {
    "format",
    "id",
    "region",
    "title",
    "bug",
    "invariant",
    "symptom",
    "expected",
    "history",
    "module",
    "since",
    "carried-when",
    "change",
}
_CHANGE_KEYS = {"function", "statement", "action", "old", "new", "after", "occurrence"}


@dataclass(frozen=True, slots=True)
class Change:
    """One change to one statement of one function."""

    function: str  # qualified name, Class.method
    statement: str  # anchor: text the statement contains (whitespace ignored)
    action: Action
    old: str = ""  # edit: text of the statement to replace (exactly once)
    new: str = ""  # edit: its replacement; replace/insert_*: the new statement(s)
    after: str = ""  # move_after: anchor of the statement to move it after
    occurrence: int = 0  # 1-based, when the anchor matches several statements; 0: unique
    # the anchors as other releases write them, tried in order after the first
    statement_alternatives: tuple[str, ...] = ()
    after_alternatives: tuple[str, ...] = ()

    @property
    def statements(self) -> tuple[str, ...]:
        return (self.statement, *self.statement_alternatives)

    @property
    def afters(self) -> tuple[str, ...]:
        return (self.after, *self.after_alternatives)


@dataclass(frozen=True, slots=True)
class Shape:
    """How an older release wrote the bug: ``statement`` in ``function`` (after the
    statement ``after``, when given). Where it holds, the release carries the bug."""

    function: str
    statement: str
    after: str = ""


@dataclass(frozen=True, slots=True)
class Entry:
    id: str
    region: str
    title: str  # one line: what the bug is
    bug: str  # what a developer could plausibly write, and why
    invariant: str  # fence-brief section 7 numbering, e.g. "I1a"
    symptom: str
    expected: Expected  # which suite should kill it
    history: str  # vLLM PRs or issues, when the bug is a reconstructed regression
    changes: tuple[Change, ...]
    path: Path
    module: str = ""  # dotted module the change applies to; "": the audited target
    since: str = ""  # the vLLM release that brought the code it changes; "": any
    carried_when: Shape | None = None  # the bug as older releases wrote it

    @property
    def mutant_id(self) -> str:
        return f"catalogue:{self.id}"


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


# --- loading ------------------------------------------------------------------


def load_catalogue(directory: Path) -> tuple[Entry, ...]:
    """Every ``*.toml`` under ``directory`` (sorted); a broken file is a ConfigError.
    An entry's id is its file's name (:func:`load_entry`), so no two share one."""
    if not directory.is_dir():
        raise ConfigError(
            "the catalogue folder does not exist",
            details={"folder": str(directory), "next": "set catalogue = PATH or create it"},
        )
    unread = sorted(
        path
        for path in directory.rglob("*")
        if path.is_file()
        and path.suffix.lower() == ".toml"
        and not (path.parent == directory and path.suffix == ".toml")
    )
    if unread:
        raise invalid_file(
            "a catalogue entry would not be read: entries are the folder's own *.toml files",
            str(unread[0]),
            "move it into the catalogue folder itself, named *.toml (lower case)",
        )
    entries = tuple(load_entry(path) for path in sorted(directory.glob("*.toml")))
    seen: dict[tuple[Change, ...], Entry] = {}
    for entry in entries:
        twin = seen.setdefault(entry.changes, entry)
        if twin is not entry:
            raise invalid_file(
                f"catalogue entries {twin.id} and {entry.id} make the same change",
                str(entry.path),
                f"remove one of them, or make it differ from {twin.path.name}",
            )
    return entries


def load_entry(path: Path) -> Entry:
    data = read_toml(path, "catalogue entry")
    where = str(path)
    known_keys(data, _ENTRY_KEYS, "a catalogue entry", file=where)
    if data.get("format", CATALOGUE_FORMAT) != CATALOGUE_FORMAT:
        raise invalid_file(
            f"catalogue format {data.get('format')!r}; this fence-audit reads {CATALOGUE_FORMAT}",
            where,
            f"write format = {CATALOGUE_FORMAT} (or leave it out)",
        )
    expected = _text(data, "expected", where)
    if expected not in EXPECTED:
        raise invalid_file(
            f"expected = {expected!r}: must be one of {', '.join(EXPECTED)}",
            where,
            "name the suite that should kill the mutant, or known-gap if none does",
        )
    identifier = _text(data, "id", where)
    if identifier != path.stem:
        raise invalid_file(
            f"id {identifier!r} differs from the file name {path.name!r}",
            where,
            f"name the file {identifier}.toml",
        )
    changes = data.get("change")
    if not isinstance(changes, list) or not changes:
        raise invalid_file(
            "an entry needs at least one [[change]]",
            where,
            "add a [[change]] table with function, statement and action",
        )
    parsed = tuple(_change(c, f"{where} [[change]] {i + 1}") for i, c in enumerate(changes))
    if len({c.function for c in parsed}) > 1:
        raise invalid_file(
            "all changes of an entry must be in one function (the executor swaps one)",
            where,
            "split it into one entry per function",
            functions=", ".join(sorted({c.function for c in parsed})),
        )
    return Entry(
        id=identifier,
        region=_text(data, "region", where),
        title=_text(data, "title", where),
        bug=_text(data, "bug", where),
        invariant=_text(data, "invariant", where),
        symptom=_text(data, "symptom", where),
        expected=expected,  # type: ignore[arg-type]
        history=str(data.get("history", "")),
        changes=parsed,
        path=path,
        module=str(data.get("module", "")),
        since=_release(data, where),
        carried_when=_shape(data.get("carried-when"), where),
    )


def _change(data: object, where: str) -> Change:
    if not isinstance(data, dict):
        raise invalid_file(
            "a [[change]] must be a table", where, "write each change as a [[change]] table"
        )
    known_keys(data, _CHANGE_KEYS, "a catalogue entry", file=where)
    action = _text(data, "action", where)
    if action not in ACTIONS:
        raise invalid_file(
            f"action = {action!r}: must be one of {', '.join(ACTIONS)}",
            where,
            "pick the action that makes the bug (mutants/README.md lists what each does)",
        )
    if action == "edit" and not isinstance(data.get("new"), str):
        raise invalid_file(
            "'new' must be a string (empty to delete 'old')",
            where,
            'write new = "TEXT", or new = "" to delete old',
        )
    needs = {
        "edit": ("old",),
        "replace": ("new",),
        "insert_before": ("new",),
        "insert_after": ("new",),
        "move_after": ("after",),
    }.get(action, ())
    for key in needs:
        if key != "after":
            _text(data, key, where)
    occurrence = data.get("occurrence", 0)  # absent: 0, the anchor must be unique
    if "occurrence" in data and (
        isinstance(occurrence, bool) or not isinstance(occurrence, int) or occurrence < 1
    ):
        raise invalid_file(
            f"occurrence = {occurrence!r}: must be a whole number >= 1",
            where,
            "count the matching statements from 1, or leave occurrence out if the anchor is unique",
        )
    statements = _texts(data, "statement", where)
    afters = _texts(data, "after", where) if action == "move_after" else ("",)
    return Change(
        function=_text(data, "function", where),
        statement=statements[0],
        action=action,  # type: ignore[arg-type]
        old=str(data.get("old", "")),
        new=str(data.get("new", "")),
        after=afters[0],
        occurrence=occurrence,
        statement_alternatives=statements[1:],
        after_alternatives=afters[1:],
    )


def _texts(data: Mapping[str, object], key: str, where: str) -> tuple[str, ...]:
    """An anchor: a string, or a list of them tried in order (as releases write it)."""
    value = data.get(key)
    if isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value):
        return tuple(value)
    if isinstance(value, list):
        raise invalid_file(
            f"{key!r} must be a non-empty list of strings",
            where,
            "give the anchor as a string, or its alternatives in order",
        )
    return (_text(data, key, where),)


def _shape(data: object, where: str) -> Shape | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise invalid_file(
            "carried-when must be a table",
            where,
            "write [carried-when] with function and statement (and after, if needed)",
        )
    known_keys(
        data,
        {"function", "statement", "after"},
        "a catalogue entry",
        file=f"{where} [carried-when]",
    )
    return Shape(
        function=_text(data, "function", where),
        statement=_text(data, "statement", where),
        after=str(data.get("after", "")),
    )


def _release(data: Mapping[str, object], where: str) -> str:
    value = data.get("since", "")
    if value and release_key(value) is None:
        raise invalid_file(
            f'since = {value!r}: must be a vLLM release such as "0.29.0"',
            where,
            "give the release that brought the code, or remove since",
        )
    return str(value)


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


def _text(data: Mapping[str, object], key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise invalid_file(
            f"{key!r} must be a non-empty string",
            where,
            f'write {key} = "..." (see mutants/README.md, "An entry")',
        )
    return value


# --- applying -------------------------------------------------------------------


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


# --- mutants --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CatalogueMutants:
    mutants: tuple[Mutant, ...]
    stale: tuple[Stale, ...]
    entries: Mapping[str, Entry]  # by mutant id
    carried: tuple[Carried, ...] = ()  # bugs this release already has
    not_yet: tuple[NotYet, ...] = ()  # entries for code of later releases


def outside_region(entry: Entry, applied: Applied, functions: tuple[str, ...]) -> Stale | None:
    """Stale when an entry of the target changes a function its region does not hold:
    its verdict would count in a region's score for code the region does not audit.

    (An entry for another module, the worker's, names functions no region of the target
    can list; those are judged by every test, see :func:`build_catalogue_mutants`.)"""
    if entry.module or applied.function in functions:
        return None
    return Stale(
        entry,
        f"it changes {applied.function}, which is not in region {entry.region} "
        f"({', '.join(functions)})",
    )


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

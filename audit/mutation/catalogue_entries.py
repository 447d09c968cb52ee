"""The catalogue read: hand-written fence bugs, one TOML file each in ``mutants/catalogue/``.

mutmut swaps operators; it cannot delete a registration, route a block to the wrong
list or move a check after job creation. A catalogue entry can. Each entry names the
function and, for every change, the statement it anchors on by text, never by line
number (:mod:`audit.mutation.catalogue` applies it). Every key is checked on read: a
broken file is a :class:`ConfigError` that names it, before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from audit.core.errors import ConfigError, invalid_file
from audit.core.inputs import known_keys, read_toml
from audit.setup.values import release_key

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


def _text(data: Mapping[str, object], key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise invalid_file(
            f"{key!r} must be a non-empty string",
            where,
            f'write {key} = "..." (see mutants/README.md, "An entry")',
        )
    return value

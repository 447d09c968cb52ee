"""``audit.json`` checked on read: typed fields, and tallies that add up.

The gate and every report believe the results file, and a file can be edited by hand,
truncated, or come from another tool. So :mod:`audit.results.report_model` reads it through
:class:`Fields`: each field must have its type (a count is a whole number of at least 0,
a status is a status), an unexpected field is refused, and a failure names the path to
the field (``mutants[3].status``) as :class:`Invalid`. Then :func:`check_tallies`
recomputes every count and score, overall and per region, from the mutants: the view
holds only recomputed values, and a file whose stored tallies disagree is refused,
naming the first field that does (``regions.flush.survived: the file says 0, its
mutants say 20``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

from audit.core.errors import ConfigError
from audit.core.inputs import brief, regular_file
from audit.results.scores import READ_FORMATS, Tally

_Enum = TypeVar("_Enum", bound=StrEnum)
_View = TypeVar("_View")

# Written since format 2 began; ``equivalent`` and ``killed_by_vllm`` came later within
# format 2, so a file may lack them (they are checked when present).
TALLY_FIELDS = ("killed", "survived", "timeout", "no_tests", "error", "judged", "score")
LATER_TALLY_FIELDS = ("equivalent", "killed_by_vllm")


class Invalid(Exception):
    """A field of the results file that is missing, of the wrong type, or out of range."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class Mismatch(Exception):
    """Stored tallies that disagree with the mutants: each as (field, stored, recomputed)."""

    def __init__(self, fields_: list[tuple[str, str, str]]) -> None:
        field, stored, actual = fields_[0]
        super().__init__(f"{field}: the file says {stored}, its mutants say {actual}")
        self.fields = fields_


def kind(value: object) -> str:
    """How a JSON value is named in a message."""
    if value is None:
        return "null"
    names = {bool: "true/false", str: "a string", int: "a number", float: "a number"}
    return names.get(type(value), "a list" if isinstance(value, list) else "an object")


def text(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise Invalid(path, f"expected a string, got {kind(value)}")
    return value


# No count, line, duration or percentage of a run comes near this; past it a number
# is a damaged file's (and 10**400 would overflow a float).
LARGEST = 10**9


def count(value: object, path: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(path, f"expected a whole number, got {kind(value)}")
    if value < minimum:
        raise Invalid(path, f"expected at least {minimum}, got {value}")
    if value > LARGEST:
        raise Invalid(
            path, f"expected at most {LARGEST:,}, got a number of {len(str(value))} digits"
        )
    return value


def number(value: object, path: str) -> float:
    """A finite number from 0 to :data:`LARGEST` (a duration, a percentage)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Invalid(path, f"expected a number, got {kind(value)}")
    if not 0 <= value <= LARGEST:  # NaN fails both comparisons
        shown = value if isinstance(value, float) else f"a number of {len(str(value))} digits"
        raise Invalid(path, f"expected a finite number from 0 to {LARGEST:,}, got {shown}")
    return float(value)


def choice(value: object, path: str, allowed: Iterable[str]) -> str:
    known = tuple(allowed)
    if text(value, path) not in known:
        raise Invalid(path, f"{value!r} is not one of {', '.join(known)}")
    return str(value)


def member(value: object, path: str, enum: type[_Enum]) -> _Enum:
    return enum(choice(value, path, (item.value for item in enum)))


def items(value: object, path: str) -> list[tuple[str, object]]:
    """A list's elements, each with its path (``mutants[3]``)."""
    if not isinstance(value, list):
        raise Invalid(path, f"expected a list, got {kind(value)}")
    return [(f"{path}[{i}]", element) for i, element in enumerate(value)]


def texts(value: object, path: str) -> tuple[str, ...]:
    return tuple(text(element, where) for where, element in items(value, path))


class Fields:
    """One JSON object of the results file, read field by field.

    Each accessor checks the field's type and names its path on failure; ``close``
    refuses the fields nobody read (a typo, or a file of another format)."""

    __slots__ = ("_data", "_read", "path")

    def __init__(self, value: object, path: str) -> None:
        if not isinstance(value, dict):
            raise Invalid(path or "the file", f"expected an object, got {kind(value)}")
        self._data: dict[str, object] = value
        self._read: set[str] = set()
        self.path = path

    def where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def names(self) -> tuple[str, ...]:
        return tuple(self._data)

    def has(self, key: str) -> bool:
        return self._data.get(key) is not None

    def raw(self, key: str, default: object = ..., *, null: bool = False) -> object:
        """The field's value; ``default`` when absent (or null, with ``null``)."""
        self._read.add(key)
        if key not in self._data or (null and self._data[key] is None):
            if default is ...:
                raise Invalid(self.where(key), "missing")
            return default
        return self._data[key]

    def text(self, key: str, default: str | None = None, *, null: bool = False) -> str:
        value = self.raw(key, ... if default is None else default, null=null)
        return text(value, self.where(key))

    def count(self, key: str, default: int | None = None) -> int:
        return count(self.raw(key, ... if default is None else default), self.where(key))

    def number(self, key: str, default: float | None = None) -> float:
        return number(self.raw(key, ... if default is None else default), self.where(key))

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise Invalid(self.where(key), f"expected true or false, got {kind(value)}")
        return value

    def texts(self, key: str, *, optional: bool = False) -> tuple[str, ...]:
        return texts(self.raw(key, [] if optional else ...), self.where(key))

    def object(self, key: str, *, optional: bool = False) -> Fields:
        return Fields(self.raw(key, {} if optional else ...), self.where(key))

    def objects(self, key: str, *, optional: bool = False) -> list[Fields]:
        value = self.raw(key, [] if optional else ...)
        return [Fields(element, where) for where, element in items(value, self.where(key))]

    def mapping(self, key: str) -> list[tuple[str, Fields]]:
        """An object whose keys are names (the regions), each value an object."""
        body = self.object(key)
        return [(name, body.object(name)) for name in body.names()]

    def close(self) -> None:
        unexpected = [key for key in self._data if key not in self._read]
        if unexpected:
            raise Invalid(self.where(unexpected[0]), "unexpected field")


def read_results(path: Path, build: Callable[[Fields], _View]) -> _View:
    """The results file at ``path``, built by ``build`` from its top-level object. Every
    failure is a ConfigError naming the file, the field and what to do."""
    document = _read(path)
    _check_format(path, document)
    try:
        return build(Fields(document, ""))
    except Invalid as error:
        raise ConfigError(
            f"the results file is damaged: {error}",
            details={"file": str(path), "next": _AGAIN},
        ) from None
    except Mismatch as error:
        details = {"file": str(path)}
        if len(error.fields) > 1:
            others = [field for field, _, _ in error.fields[1:]]
            shown = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
            fields_ = "field disagrees" if len(others) == 1 else "fields disagree"
            details["also"] = f"{len(others)} more {fields_} ({shown})"
        details["next"] = "the file was changed after `fence-audit mutate` wrote it; " + _AGAIN
        raise ConfigError(f"the results file does not add up: {error}", details=details) from None


_AGAIN = "run `fence-audit mutate` again"


def _read(path: Path) -> object:
    try:
        return json.loads(regular_file(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            "no results file",
            details={"file": str(path), "next": "run `fence-audit mutate` first"},
        ) from None
    except OSError as error:  # a folder, no permission
        raise ConfigError(
            "the results file cannot be read",
            details={
                "file": str(path),
                "error": error.strerror or str(error),
                "next": "give the path of an audit.json file you can read",
            },
        ) from None
    except (ValueError, RecursionError) as error:  # not JSON, not UTF-8, beyond reading
        raise ConfigError(
            "the results file is not valid JSON",
            details={"file": str(path), "error": brief(error), "next": _AGAIN},
        ) from None


def _check_format(path: Path, document: object) -> None:
    """An audit.json of this format, or an error naming what the file is instead."""
    if isinstance(document, dict) and document.get("format") in READ_FORMATS:
        return
    what = _foreign(document)
    if what:
        raise ConfigError(
            f"{path.name} is {what}, not the results of `fence-audit mutate`",
            details={
                "file": str(path),
                "next": "give the audit.json that `fence-audit mutate` writes beside it",
            },
        )
    if not isinstance(document, dict):
        kind = {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(document), "a number"
        )
        raise ConfigError(
            f"the results file holds {kind}, not the object `fence-audit mutate` writes",
            details={"file": str(path), "next": "give the audit.json of a fence-audit run"},
        )
    if "format" not in document:
        raise ConfigError(
            "the results file has no format field: not an audit.json of fence-audit's",
            details={"file": str(path), "next": "give the audit.json of a fence-audit run"},
        )
    raise ConfigError(
        f"the results file has format {document['format']!r}; this fence-audit reads format "
        + " and ".join(map(str, READ_FORMATS)),
        details={"file": str(path), "next": "run `fence-audit mutate` with this version"},
    )


def _foreign(document: object) -> str:
    """Which other file of fence-audit's this is, told by its fields; "" if none."""
    if not isinstance(document, dict) or "mutants" in document:
        return ""
    if "lines" in document and "tests" in document:
        return "a coverage map"
    if "regions" in document:
        return "a region coverage file (regions.json)"
    if "schemaVersion" in document and "files" in document:
        return "a Stryker mutation report (mutation.json)"
    return ""


def stored_tally(body: Fields) -> dict[str, object]:
    """The tally fields a region (or the overall ``score``) stores, type-checked; the
    ones written since format 2 began must be there."""
    stored: dict[str, object] = {}
    for name in (*TALLY_FIELDS, *LATER_TALLY_FIELDS):
        required = name in TALLY_FIELDS
        if name == "score":
            value = body.raw(name, ...)
            stored[name] = None if value is None else number(value, body.where(name))
        elif required or body.has(name):
            stored[name] = body.count(name)
        else:
            body.raw(name, None)  # absent or null: nothing to compare
    return stored


def check_tallies(
    stored: Mapping[str, dict[str, object]], recomputed: Mapping[str, tuple[Tally, int]]
) -> None:
    """Compare each stored tally (by path: ``score``, ``regions.flush``) with the one
    recomputed from the mutants, with its kills by vLLM's tests; :class:`Mismatch`
    lists every field that disagrees."""
    wrong: list[tuple[str, str, str]] = []
    for path, (tally, by_vllm) in recomputed.items():
        actual: dict[str, object] = {f.name: getattr(tally, f.name) for f in fields(Tally)}
        actual |= {"judged": tally.judged, "score": tally.score, "killed_by_vllm": by_vllm}
        for name, value in stored[path].items():
            if not _agrees(value, actual[name]):
                wrong.append((f"{path}.{name}", _shown(value), _shown(actual[name])))
    if wrong:
        raise Mismatch(wrong)


def _agrees(stored: object, actual: object) -> bool:
    if isinstance(stored, float) and isinstance(actual, float):
        return abs(stored - actual) <= 0.005 + 1e-9  # the file rounds to two decimals
    return stored == actual


def _shown(value: object) -> str:
    if value is None:
        return "null"
    return f"{round(value, 2):g}" if isinstance(value, float) else str(value)

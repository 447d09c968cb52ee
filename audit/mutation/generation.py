"""mutmut's mutations of the audited functions, kept one function at a time.

A function's mutations depend only on its own text (its decorators to its last
line): mutmut's operators, pragmas and ordinals look no further. So each function is
generated alone (:func:`audit.mutation.mutmut_adapter.generate`) and its mutations are kept
under the cache folder by the hash of its text, with lines counted from the
function's first line: an edit elsewhere in the file, or a move, reuses them, and a
run whose functions are all kept imports neither libcst nor mutmut.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from audit.core import cache
from audit.core.protocol import LineEdit
from audit.mutation.records import Mutation
from audit.setup.regions import find_function
from audit.setup.regions import first_line as text_start

# Bump when what generate() makes of a function's text changes: cached mutations of
# an older generator are then ignored.
GENERATOR_VERSION = 1


def generate_cached(
    source: str,
    functions: Iterable[str],
    cache_dir: Path | None,
    near: Collection[int] | None = None,
) -> list[Mutation]:
    """:func:`audit.mutation.mutmut_adapter.generate`'s mutations of ``functions``, one
    function at a time: each parsed alone (a method under a bare ``class`` header,
    columns unchanged), or read from ``cache_dir`` (None: nothing is read or
    written). ``near`` as for ``generate``: only mutations by these lines."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    located = []
    for qualname in set(functions):
        node = find_function(tree, qualname)
        if node is not None:
            first = text_start(node)
            located.append((first, qualname, "".join(lines[first - 1 : node.end_lineno])))
    mutations: list[Mutation] = []
    for first, qualname, text in sorted(located):
        for relative in _function_mutations(qualname, text, cache_dir):
            mutation = _shifted(relative, first - 1)
            if near is None or any(
                line in near for line in range(mutation.line - 1, mutation.end_line + 2)
            ):
                mutations.append(mutation)
    return mutations


def _function_mutations(qualname: str, text: str, cache_dir: Path | None) -> list[Mutation]:
    """The mutations of one function's ``text``, lines counted from its first line."""
    material = [GENERATOR_VERSION, _TOOL_VERSIONS, qualname, text]
    key = hashlib.sha256(json.dumps(material).encode()).hexdigest()[:32]
    path = cache_dir / f"{key}.json" if cache_dir is not None else None
    if path is not None and path.is_file():
        try:
            made = [_from_json(record) for record in json.loads(path.read_text())]
            cache.used(path)
            return made
        except (OSError, ValueError, KeyError, TypeError):
            pass  # damaged: made again below, and rewritten
    # A method is parsed under a bare header of its class: line 2 is its first line.
    header = f"class {qualname.rpartition('.')[0]}:\n" if "." in qualname else ""
    offset = -1 if header else 0
    from audit.mutation import (
        mutmut_adapter,  # libcst and mutmut: a second to import, only on a miss
    )

    made = mutmut_adapter.generate(header + text, [qualname])
    mutations = [_shifted(m, offset) for m in made]
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps([_to_json(m) for m in mutations]))
        temporary.replace(path)
    return mutations


def _shifted(mutation: Mutation, by: int) -> Mutation:
    edits = tuple(LineEdit(e.start + by, e.end + by, e.new_lines) for e in mutation.edits)
    return Mutation(
        function=mutation.function,
        function_line=mutation.function_line + by,
        operator=mutation.operator,
        line=mutation.line + by,
        column=mutation.column,
        end_line=mutation.end_line + by,
        end_column=mutation.end_column,
        variant=mutation.variant,
        ordinal=mutation.ordinal,
        edits=edits,
    )


def _to_json(mutation: Mutation) -> dict[str, object]:
    record: dict[str, object] = {
        name: getattr(mutation, name) for name in Mutation.__dataclass_fields__ if name != "edits"
    }
    record["edits"] = [[e.start, e.end, list(e.new_lines)] for e in mutation.edits]
    return record


def _from_json(record: dict[str, Any]) -> Mutation:
    edits = tuple(LineEdit(start, end, tuple(new)) for start, end, new in record.pop("edits"))
    return Mutation(**record, edits=edits)


def _tool_versions() -> list[str]:
    """mutmut's and libcst's versions: either may change what a function yields."""
    from importlib.metadata import PackageNotFoundError, version

    versions = []
    for name in ("mutmut", "libcst"):
        try:
            versions.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            versions.append(f"{name} unknown")
    return versions


_TOOL_VERSIONS = _tool_versions()

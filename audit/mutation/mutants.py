"""Mutants: mutmut's mutations of the region functions, with ids, regions and tests.

A mutant's id is ``Class.method:operator@LINE:COL#VARIANT`` where LINE is counted
from the function's ``def`` line: an edit elsewhere in the file renames nothing,
and ids compare across runs and vLLM versions. Only mutants whose changed lines
all lie in one region are judged; the rest are listed as out of region.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from coverage.parser import PythonParser

from audit.core.protocol import LineEdit, edited_lines
from audit.mutation import generation
from audit.mutation.records import Mutation
from audit.setup.model import Mutant
from audit.setup.regions import Region


@dataclass(frozen=True, slots=True)
class OutOfRegion:
    id: str
    function: str
    line: int


@dataclass(frozen=True, slots=True)
class MutantSet:
    mutants: tuple[Mutant, ...]  # in region, to judge
    out_of_region: tuple[OutOfRegion, ...]
    function_hashes: Mapping[str, str]  # qualname -> sha256 of its source text


def mutant_id(mutation: Mutation) -> str:
    """``Class.method:operator@L:C-L:C#V``, lines counted from the ``def`` line."""
    start = f"{mutation.line - mutation.function_line}:{mutation.column}"
    end = f"{mutation.end_line - mutation.function_line}:{mutation.end_column}"
    return f"{mutation.function}:{mutation.operator}@{start}-{end}#{mutation.variant}"


def build_mutants(
    source: str,
    filename: str,
    regions: tuple[Region, ...],
    lines_to_tests: Mapping[int, tuple[str, ...]],
    *,
    functions: Iterable[str] | None = None,
    place: Callable[[tuple[int, ...]], str | None] | None = None,
    near: Collection[int] | None = None,
    cache_dir: Path | None = None,
) -> MutantSet:
    """mutmut's mutants of the region functions, each in the one region holding all its
    changed lines (or listed as out of region).

    Pull-request mode (:mod:`audit.mutation.changes`) gives the ``functions`` holding changed
    lines instead, and ``place``: a mutant's region from its changed lines, or None to
    leave it out (on no changed line); nothing is then out of region. ``near``: the
    changed lines, to skip early the mutations that cannot touch them. ``cache_dir``:
    where each function's mutations are kept, by its text (None: made afresh)."""
    if functions is None:
        functions = sorted({f for region in regions for f in region.functions})
    functions = sorted(functions)
    region_of_line = {line: region.name for region in regions for line in region.lines}
    tests_of = TestsOfLines(source, filename, lines_to_tests)
    original = source.splitlines(keepends=True)

    mutants: list[Mutant] = []
    outside: list[OutOfRegion] = []
    for mutation in generation.generate_cached(source, functions, cache_dir, near):
        identifier = mutant_id(mutation)
        if place is None:
            owners = {region_of_line.get(line, "") for line in mutation.changed_lines}
        else:  # pull-request mode: its region, the group, or not on the change at all
            owners = {place(mutation.changed_lines) or ""}
            if "" in owners:
                continue
        if len(owners) != 1 or "" in owners:
            outside.append(OutOfRegion(identifier, mutation.function, mutation.line))
            continue
        mutated = edited_lines(original, mutation.edits)
        covered = tests_of(mutation.changed_lines)
        mutants.append(
            Mutant(
                id=identifier,
                origin="mutmut",
                region=owners.pop(),
                function=mutation.function,
                operator=mutation.operator,
                ordinal=mutation.ordinal,
                line=mutation.line,
                changed_lines=mutation.changed_lines,
                diff=unified_diff(original, mutated, filename, edits=mutation.edits),
                edits=mutation.edits,
                covered_by=tuple(covered),
            )
        )
    _check_unique(m.id for m in mutants)
    return MutantSet(
        mutants=tuple(mutants),
        out_of_region=tuple(outside),
        function_hashes=function_hashes(source, functions),
    )


def function_hashes(source: str, functions: Iterable[str]) -> dict[str, str]:
    """sha256 of each function's own text: unchanged by edits elsewhere in the file."""
    import ast

    from audit.setup.regions import find_function, first_line

    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    hashes = {}
    for qualname in functions:
        node = find_function(tree, qualname)
        if node is None:
            continue
        first = first_line(node)
        text = "".join(lines[first - 1 : node.end_lineno])
        hashes[qualname] = hashlib.sha256(text.encode()).hexdigest()
    return hashes


def unified_diff(
    original: list[str], mutated: list[str], filename: str, *, edits: Iterable[LineEdit] = ()
) -> str:
    """The unified diff (two lines of context) of a mutant, computed on the lines
    around its change: the lines both texts share at their start and end are left
    out first, as difflib would only report them as context, and the hunk headers
    are shifted back to the file's line numbers. ``edits``: those that made
    ``mutated`` from ``original``, when known; the lines before the first and after
    the last are then not compared (they are the same)."""
    name = filename.rsplit("/", 1)[-1]
    limit = min(len(original), len(mutated))
    edits = tuple(edits)
    head = min(min((e.start - 1 for e in edits), default=0), limit)
    while head < limit and original[head] == mutated[head]:
        head += 1
    tail = min((len(original) - e.end for e in edits), default=0)
    tail = max(min(tail, limit - head), 0)
    while tail < limit - head and original[-1 - tail] == mutated[-1 - tail]:
        tail += 1
    start = max(head - CONTEXT, 0)
    lines = difflib.unified_diff(
        original[start : len(original) - max(tail - CONTEXT, 0)],
        mutated[start : len(mutated) - max(tail - CONTEXT, 0)],
        f"a/{name}",
        f"b/{name}",
        n=CONTEXT,
    )
    return "".join(_shift_hunk(line, start) if line.startswith("@@") else line for line in lines)


CONTEXT = 2  # lines of context around a change, in every diff of a mutant
_HUNK = re.compile(r"^@@ -(\d+)((?:,\d+)?) \+(\d+)((?:,\d+)?) @@")


def _shift_hunk(header: str, by: int) -> str:
    match = _HUNK.match(header)
    if match is None or not by:
        return header
    old, old_len, new, new_len = match.groups()
    return f"@@ -{int(old) + by}{old_len} +{int(new) + by}{new_len} @@" + header[match.end() :]


class TestsOfLines:
    """The baseline's tests that ran the statements a set of changed lines belongs to.

    Coverage records a multi-line statement on a line of its own choosing: the
    header of a one-line ``if``, but the condition's first line when the condition
    spans several (``if (`` is never recorded). So a changed line counts the tests
    of every line of its statement, not of one chosen line.
    """

    __test__ = False

    def __init__(
        self, source: str, filename: str, lines_to_tests: Mapping[int, tuple[str, ...]]
    ) -> None:
        self._start = statement_starts(source, filename)
        self._tests: dict[int, set[str]] = {}
        for line, tests in lines_to_tests.items():
            self._tests.setdefault(self._start.get(line, line), set()).update(tests)

    def __call__(self, changed_lines: Iterable[int]) -> list[str]:
        starts = {self._start.get(line, line) for line in changed_lines}
        return sorted({t for start in starts for t in self._tests.get(start, ())})


def statement_starts(source: str, filename: str) -> dict[int, int]:
    """Each line of a multi-line statement -> the line coverage.py records it on."""
    parser = PythonParser(text=source, filename=filename)
    parser.parse_source()
    starts: dict[int, int] = {}
    for line in range(1, len(source.splitlines()) + 1):
        starts[line] = parser.first_line(line)
    return starts


def _check_unique(ids: Iterable[str]) -> None:
    seen: set[str] = set()
    for identifier in ids:
        if identifier in seen:
            raise AssertionError(f"two mutants share the id {identifier}")
        seen.add(identifier)

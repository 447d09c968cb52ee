"""One of mutmut's mutations of a function: where it lies and the line edits it makes.

Its own module so that the generator (:mod:`audit.mutation.generation`) and mutmut's
adapter (:mod:`audit.mutation.mutmut_adapter`), which makes these records, both import
it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from audit.core.protocol import LineEdit


@dataclass(frozen=True, slots=True)
class Mutation:
    function: str  # qualified name: Class.method
    function_line: int  # the ``def`` line in this source
    operator: str  # mutmut's operator, without its ``operator_`` prefix
    line: int  # where the mutated node starts (file line)
    column: int
    end_line: int  # and ends: nested nodes may start at the same place
    end_column: int
    variant: int  # which of the operator's outputs for this node
    ordinal: int  # mutmut's own 1-based number of this mutation within the function
    edits: tuple[LineEdit, ...]

    @property
    def changed_lines(self) -> tuple[int, ...]:
        lines: list[int] = []
        for edit in self.edits:
            lines.extend(range(edit.start, max(edit.end, edit.start) + 1))
        return tuple(lines)

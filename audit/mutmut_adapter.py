"""Everything mutmut-specific: its mutation operators, turned into our own mutants.

mutmut 3 writes a trampolined copy of each module and numbers mutants per run
(``x_f__mutmut_7``); neither leaks out of this module. We drive mutmut's libcst
visitor and operators directly on the text of the audited module (a string: the
installed file is never handed to mutmut), record which operator made each
mutation and where, and return plain :class:`Mutation` values: a function, an
operator, a position relative to the function, and the exact line edit.

This is the one file to change when mutmut changes.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider
from mutmut.mutation.file_mutation import MutationVisitor, OuterFunctionProvider, deep_replace
from mutmut.mutation.mutators import mutation_operators
from mutmut.mutation.pragma_handling import IgnoredCode, PragmaVisitor

from audit.model import LineEdit

MUTMUT_RANGE = ">=3.8,<3.9"


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
    edits: tuple[LineEdit, ...]

    @property
    def changed_lines(self) -> tuple[int, ...]:
        lines: list[int] = []
        for edit in self.edits:
            lines.extend(range(edit.start, max(edit.end, edit.start) + 1))
        return tuple(lines)


class _RecordingVisitor(MutationVisitor):
    """mutmut's visitor, also recording which operator made each mutation."""

    def __init__(self, ignored: IgnoredCode) -> None:
        super().__init__(mutation_operators, ignored)
        self.records: list[tuple[str, CodeRange, int, cst.CSTNode, cst.CSTNode, cst.CSTNode]] = []

    def _create_mutations(self, node: cst.CSTNode) -> None:
        outer = self.get_metadata(OuterFunctionProvider, node, None)
        position = self.get_metadata(PositionProvider, node, None)
        if outer is None or position is None:
            return
        for node_type, operator in self._operators:
            if not isinstance(node, node_type):
                continue
            for variant, mutated in enumerate(operator(node)):
                if self._removes_ignored_code(node, mutated):
                    continue
                name = operator.__name__.removeprefix("operator_")
                self.records.append((name, position, variant, node, mutated, outer))


def generate(source: str, functions: Iterable[str]) -> list[Mutation]:
    """Every mutmut mutation inside ``functions`` (qualified names) of ``source``."""
    wanted = set(functions)
    wrapper = MetadataWrapper(cst.parse_module(source))
    pragmas = PragmaVisitor("<audited module>")
    wrapper.visit(pragmas)
    ignored = IgnoredCode(
        no_mutate_lines=pragmas.no_mutate_lines,
        ignore_node_lines=pragmas.ignore_node_lines,
        ignore_pattern_lines=set(),
    )
    visitor = _RecordingVisitor(ignored)
    wrapper.visit(visitor)
    module = wrapper.module
    qualnames = _qualnames(module)
    positions = wrapper.resolve(PositionProvider)
    file_lines = source.splitlines()

    rendered: dict[int, tuple[list[str], int, str, list[bool]]] = {}
    mutations = []
    for operator, where, variant, node, mutated, outer in visitor.records:
        qualname = qualnames.get(id(outer))
        if qualname not in wanted or not isinstance(outer, cst.FunctionDef):
            continue
        if id(outer) not in rendered:
            rendered[id(outer)] = _locate(module, outer, positions[outer].start.line, file_lines)
        original, first_line, indent, indented = rendered[id(outer)]
        replaced = deep_replace(outer, node, mutated)
        if not isinstance(replaced, cst.CSTNode):
            continue
        changed = module.code_for_node(replaced).splitlines()
        edits = _edits(original, changed, first_line, indent, indented)
        if not edits:
            continue
        def_line = positions[outer].start.line
        mutations.append(
            Mutation(
                function=qualname,
                function_line=def_line,
                operator=operator,
                line=where.start.line,
                column=where.start.column,
                end_line=where.end.line,
                end_column=where.end.column,
                variant=variant,
                edits=tuple(edits),
            )
        )
    return mutations


def _qualnames(module: cst.Module) -> dict[int, str]:
    """id(FunctionDef) -> qualified name, for module functions and class methods."""
    names: dict[int, str] = {}
    for child in module.body:
        if isinstance(child, cst.FunctionDef):
            names[id(child)] = child.name.value
        elif isinstance(child, cst.ClassDef) and isinstance(child.body, cst.IndentedBlock):
            for method in child.body.body:
                if isinstance(method, cst.FunctionDef):
                    names[id(method)] = f"{child.name.value}.{method.name.value}"
    return names


def _locate(
    module: cst.Module, function: cst.FunctionDef, def_line: int, file_lines: list[str]
) -> tuple[list[str], int, str, list[bool]]:
    """A function's standalone rendering, where it sits in the file, and how to indent it.

    libcst renders a method without its class's indentation (but the continuation
    lines of a multi-line string verbatim), with its leading blank lines and
    decorators. This finds the file line of the rendering's first line, and for each
    rendered line whether the class indentation must be added back; it checks that
    the rendering matches the file line for line.
    """
    lines = module.code_for_node(function).splitlines()
    def_index = next(
        i for i, text in enumerate(lines) if text.lstrip().startswith(("def ", "async def "))
    )
    first_line = def_line - def_index
    file_def = file_lines[def_line - 1]
    indent = file_def[: len(file_def) - len(file_def.lstrip())]
    indented: list[bool] = []
    for offset, text in enumerate(lines):
        expected = file_lines[first_line - 1 + offset].rstrip()
        if (indent + text).rstrip() == expected and text.strip():
            indented.append(True)
        elif text.rstrip() == expected:
            indented.append(False)
        else:
            raise ValueError(
                f"mutmut adapter: rendering of {function.name.value} does not match the "
                f"source at line {first_line + offset}"
            )
    return lines, first_line, indent, indented


def _edits(
    original: list[str], changed: list[str], first_line: int, indent: str, indented: list[bool]
) -> list[LineEdit]:
    matcher = difflib.SequenceMatcher(a=original, b=changed, autojunk=False)
    edits = []
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag == "equal":
            continue
        new = []
        for j, text in enumerate(changed[b0:b1]):
            # indent like the original line this one replaces (or follows, for inserts)
            k = min(a0 + j, a1 - 1) if a1 > a0 else max(a0 - 1, 0)
            new.append(indent + text if indented[k] and text.strip() else text)
        edits.append(LineEdit(first_line + a0, first_line + a1 - 1, tuple(new)))
    return edits


def group_by_function(mutations: Iterable[Mutation]) -> dict[str, list[Mutation]]:
    groups: dict[str, list[Mutation]] = defaultdict(list)
    for mutation in mutations:
        groups[mutation.function].append(mutation)
    return dict(groups)

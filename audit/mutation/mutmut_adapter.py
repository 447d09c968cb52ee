"""Everything mutmut-specific: its mutation operators, turned into our own mutants.

mutmut 3 writes a trampolined copy of each module and numbers mutants per run
(``x_f__mutmut_7``); neither leaks out of this module. We drive mutmut's libcst
visitor and operators directly on the text of the audited module (a string: the
installed file is never handed to mutmut), record which operator made each
mutation and where, and return plain :class:`Mutation` values: a function, an
operator, a position relative to the function, and the exact line edit.

The same mutants can also be judged by mutmut's own runner (:func:`judge`, the
``--engine mutmut`` cross-check): a project staged as a plain mutmut user would,
``mutmut run`` on exactly our mutants, its exit codes turned into our statuses.

This is the one file to change when mutmut changes.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider
from mutmut.mutation.file_mutation import MutationVisitor, OuterFunctionProvider, deep_replace
from mutmut.mutation.mutators import mutation_operators
from mutmut.mutation.pragma_handling import IgnoredCode, PragmaVisitor
from mutmut.utils.format_utils import mangled_name_from_mutant_name

from audit.core.hermetic import child_environment, prepare_hf_home
from audit.core.protocol import LineEdit, MutantStatus, is_project_test
from audit.mutation.records import Mutation
from audit.setup.config import Config
from audit.setup.model import Mutant, MutantResult, Target
from audit.setup.session import TEST_PROCESS_PLUGINS
from audit.setup.suite import Suite


class _RecordingVisitor(MutationVisitor):
    """mutmut's visitor, also recording which operator made each mutation."""

    def __init__(self, ignored: IgnoredCode) -> None:
        super().__init__(mutation_operators, ignored)
        self.records: list[
            tuple[str, CodeRange | None, int, cst.CSTNode, cst.CSTNode, cst.CSTNode | None]
        ] = []

    def _create_mutations(self, node: cst.CSTNode) -> None:
        # Every mutation mutmut itself would make is recorded, in mutmut's order, so
        # that our ordinals match its per-function mutant numbers.
        outer = self.get_metadata(OuterFunctionProvider, node, None)
        position = self.get_metadata(PositionProvider, node, None)
        for node_type, operator in self._operators:
            if not isinstance(node, node_type):
                continue
            for variant, mutated in enumerate(operator(node)):
                if self._removes_ignored_code(node, mutated):
                    continue
                name = operator.__name__.removeprefix("operator_")
                self.records.append((name, position, variant, node, mutated, outer))


def generate(
    source: str, functions: Iterable[str], near: Collection[int] | None = None
) -> list[Mutation]:
    """Every mutmut mutation inside ``functions`` (qualified names) of ``source``.

    ``near`` (pull-request mode): only mutations of a node that spans, or borders, one
    of these lines. Rendering a mutation costs most of the time here, and a mutation's
    edits lie within its node's lines, so the others are skipped before rendering."""
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
    ordinals: dict[int, int] = defaultdict(int)
    for operator, where, variant, node, mutated, outer in visitor.records:
        ordinals[id(outer)] += 1
        qualname = qualnames.get(id(outer))
        if qualname not in wanted or not isinstance(outer, cst.FunctionDef) or where is None:
            continue
        if near is not None and not _borders(where, near):
            continue
        edits = _spliced(module, node, mutated, where, file_lines)
        if edits is None:  # the node's text is not where its position says: render it all
            if id(outer) not in rendered:
                rendered[id(outer)] = _locate(
                    module, outer, positions[outer].start.line, file_lines
                )
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
                ordinal=ordinals[id(outer)],
                edits=tuple(edits),
            )
        )
    return mutations


def _spliced(
    module: cst.Module,
    node: cst.CSTNode,
    mutated: cst.CSTNode,
    where: CodeRange,
    file_lines: list[str],
) -> list[LineEdit] | None:
    """The edits that put ``mutated``'s text in place of ``node``'s, at ``where``.

    Rendering the whole function for each mutation (mutmut's ``deep_replace``) costs
    most of generation; rendering the two nodes is enough. A node renders without
    the parentheses around it (which its position leaves out too) and without its
    block's indentation on its continuation lines; :func:`_edits` adds that back as
    for a whole function. None when the rendering does not match the file line for
    line: the caller then renders the whole function.
    """
    old_parens = (getattr(node, "lpar", ()), getattr(node, "rpar", ()))
    if any(old_parens):
        if (getattr(mutated, "lpar", None), getattr(mutated, "rpar", None)) != old_parens:
            return None
        node = node.with_changes(lpar=(), rpar=())
        mutated = mutated.with_changes(lpar=(), rpar=())
    span = file_lines[where.start.line - 1 : where.end.line]
    old = module.code_for_node(node).split("\n")
    new = module.code_for_node(mutated).split("\n")
    if not span or len(old) != len(span):
        return None
    before, after = span[0][: where.start.column], span[-1][where.end.column :]
    for lines in (old, new):  # one line may be both the first and the last
        lines[0] = before + lines[0]
        lines[-1] += after
    pairs = list(zip(old[1:], span[1:], strict=True))
    indent = next((line[: len(line) - len(text)] for text, line in pairs if text.strip()), "")
    indented = [False]
    for text, line in pairs:
        if text.strip() and indent + text == line:
            indented.append(True)
        elif text == line:  # a multi-line string's own lines, kept verbatim
            indented.append(False)
        else:
            return None
    if old[0] != span[0]:
        return None
    return _edits(old, new, where.start.line, indent, indented)


def _borders(where: CodeRange, lines: Collection[int]) -> bool:
    """Whether a node's lines, or the line on either side, include one of ``lines``."""
    return any(line in lines for line in range(where.start.line - 1, where.end.line + 2))


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


# --- mutmut's own runner, as a second engine over the same mutants ------------

# mutmut's exit-code vocabulary (mutmut.stats.status_by_exit_code) in our statuses.
# mutmut's status names (mutmut.stats.status_by_exit_code) in our vocabulary.
_STATUS = {
    "killed": MutantStatus.KILLED,
    "survived": MutantStatus.SURVIVED,
    "timeout": MutantStatus.TIMEOUT,
    "no tests": MutantStatus.NO_TESTS,
}


def mutmut_name(module: str, function: str, ordinal: int) -> str:
    """mutmut's name for a mutant: ``pkg.mod.xǁClassǁmethod__mutmut_7``."""
    from mutmut.mutation.trampoline_templates import mangle_function_name

    class_name, _, name = function.rpartition(".")
    mangled = mangle_function_name(name=name, class_name=class_name or None)
    return f"{module}.{mangled}__mutmut_{ordinal}"


def stage_project(
    project: Path,
    *,
    module: str,
    source: str,
    installed_package: Path,
    tests_root: Path,
    test_paths: Iterable[str],
    pytest_args: Iterable[str],
) -> None:
    """Lay out a project the way a plain mutmut user would, with a shadow package.

    mutmut mutates files inside its project (pointed at site-packages it rewrites
    the installed file), so the audited module is copied into ``project`` under its
    package path; each shadow ``__init__.py`` puts the installed package after
    itself on ``__path__`` and runs the installed ``__init__``, so every other
    module still comes from the installed vLLM.
    """
    if project.exists():
        shutil.rmtree(project)
    parts = module.split(".")
    for depth in range(1, len(parts)):
        package = project.joinpath(*parts[:depth])
        package.mkdir(parents=True, exist_ok=True)
        real = installed_package.parent.joinpath(*parts[:depth])
        (package / "__init__.py").write_text(_SHADOW_INIT.format(real=str(real)))
    project.joinpath(*parts[:-1], parts[-1] + ".py").write_text(source)
    # The suite root's tests/ already leaves vLLM's root conftest.py out.
    (project / "tests").symlink_to(tests_root / "tests")
    relpath = "/".join(parts) + ".py"
    (project / "pyproject.toml").write_text(
        "[tool.mutmut]\n"
        f"source_paths = [{json.dumps(parts[0])}]\n"
        f"only_mutate = [{json.dumps(relpath)}]\n"
        'also_copy = ["tests"]\n'
        f"pytest_add_cli_args_test_selection = {json.dumps(list(test_paths))}\n"
        f"pytest_add_cli_args = {json.dumps(list(pytest_args))}\n"
    )


_SHADOW_INIT = """\
# Generated by fence-audit: a shadow of the installed package {real}.
__path__.append({real!r})
_init = {real!r} + "/__init__.py"
with open(_init) as _file:
    exec(compile(_file.read(), _init, "exec"))
"""


def judge(
    config: Config,
    suite: Suite,
    target: Target,
    mutants: Iterable[Mutant],
    jobs: int,
    *,
    tests: Iterable[str] = (),
    log: str = "mutmut.log",
) -> dict[str, MutantResult]:
    """The same mutants judged by mutmut's own runner, for cross-checking the fork engine.
    ``tests``: the test ids mutmut selects (default: vLLM's paths of the suite); ``log``:
    its log's name in the reports' logs folder.

    No cache and no killer names: mutmut records neither."""
    mutants = tuple(mutants)  # iterated twice
    project = project_dir(config)
    stage_project(
        project,
        module=target.module,
        source=target.path.read_text(),
        installed_package=_package_root(target),
        tests_root=suite.root,
        test_paths=list(tests) or [p for p in suite.paths if not is_project_test(p)],
        # The same plugins as the audit's own test processes: both executors see one vLLM.
        pytest_args=[
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore::pytest.PytestUnknownMarkWarning",
            *TEST_PROCESS_PLUGINS,
        ],
    )
    chosen = [m for m in mutants if m.covered_by]
    names = {mutmut_name(target.module, m.function, m.ordinal): m for m in chosen}
    hf_home = prepare_hf_home(config.cache_dir, config.offline_models)
    started = time.monotonic()
    statuses = run_mutmut(
        project,
        sorted(names),
        jobs=jobs,
        env=child_environment(os.environ, hf_home),
        log=config.reports_dir / "logs" / log,
    )
    elapsed = time.monotonic() - started
    verdicts = {m.id: MutantResult(m.id, MutantStatus.NO_TESTS) for m in mutants}
    for name, mutant in names.items():
        status = statuses.get(name)
        verdicts[mutant.id] = MutantResult(
            mutant.id,
            status or MutantStatus.ERROR,
            failure="" if status else "mutmut recorded no verdict",
            duration_s=round(elapsed / max(len(names), 1), 3),
        )
    return verdicts


def project_dir(config: Config) -> Path:
    """Where :func:`judge` stages mutmut's project (each run stages it afresh)."""
    return config.reports_dir / ".work" / "mutmut"


def run_orders(
    project: Path, module: str, mutants: Iterable[Mutant], known: Collection[str]
) -> dict[str, tuple[str, ...]]:
    """Each mutant's tests in the order mutmut's last run in ``project`` ran them: the
    tests its stats saw calling the mutant's function, fastest first by the durations
    it measured (ties, which mutmut leaves to a set's order, by name). Tests outside
    ``known`` (the baseline's) are left out; a mutant whose function no test called
    is too, and every mutant when mutmut's run left no stats (it failed before them)."""
    try:
        stats = json.loads((project / "mutants" / "mutmut-stats.json").read_text())
        tests_of: dict[str, list[str]] = stats["tests_by_mangled_function_name"]
        duration: dict[str, float] = stats["duration_by_test"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    orders = {}
    for mutant in mutants:
        name = mutmut_name(module, mutant.function, mutant.ordinal)
        tests = tests_of.get(mangled_name_from_mutant_name(name), [])
        ordered = sorted(tests, key=lambda t: (duration.get(t, 0.0), t))
        if mine := tuple(t for t in ordered if t in known):
            orders[mutant.id] = mine
    return orders


def _package_root(target: Target) -> Path:
    """The installed top-level package folder of the target (site-packages/vllm)."""
    depth = len(target.module.split(".")) - 1
    return target.installed_path.parents[depth - 1]


def run_mutmut(
    project: Path, names: Iterable[str], *, jobs: int, env: Mapping[str, str], log: Path
) -> dict[str, MutantStatus]:
    """``mutmut run NAMES`` in ``project``; each name's status in our vocabulary."""
    with log.open("w") as out:
        subprocess.run(
            [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs), *names],
            cwd=project,
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    from mutmut.stats import status_by_exit_code

    statuses: dict[str, MutantStatus] = {}
    for meta in (project / "mutants").rglob("*.meta"):
        data = json.loads(meta.read_text())
        for name, exit_code in data.get("exit_code_by_key", {}).items():
            statuses[name] = _STATUS.get(status_by_exit_code[exit_code], MutantStatus.ERROR)
    return statuses

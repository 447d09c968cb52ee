"""What the test process is asked to judge: a :class:`audit.core.protocol.Job` per mutant.

A job carries the mutant's edits, the frame that lets the judging fork compile the
mutated function alone, the covering tests in the order to run them, and the time
budgets that turn a hang into a verdict.
"""

from __future__ import annotations

import ast
import functools
import keyword
import math
import os
import re
import uuid
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from audit.core.errors import ExecutorFailed
from audit.core.protocol import (
    Chain,
    Frame,
    Job,
    LineEdit,
    Member,
    is_project_test,
    worst_hangs,
)
from audit.setup.model import Mutant
from audit.setup.regions import find_function, first_line


@dataclass(frozen=True, slots=True)
class ExecutorOptions:
    jobs: int = os.cpu_count() or 1
    # A test's budget of CPU seconds: this times its baseline duration, and never
    # less than the minimum; blocked (no CPU) for a fifth of it (two seconds at least,
    # testproc.judge.BLOCKED_MIN_S), it is hung too.
    timeout_factor: float = 10.0
    timeout_min_s: float = 2.0
    # Budgets of its first hung test that a mutant's hangs may spend before it is
    # judged TIMEOUT (testproc.judge.run_tests).
    max_hangs: int = 3
    use_cache: bool = True
    # Run each mutant's covering tests in the order they are given (its
    # ``covered_by``), unguided by what killed its function's other mutants: how the
    # benchmark replays another engine's order (bench.ours_in_order). Its
    # verdicts are kept apart from those of the usual order (VerdictCache.key).
    keep_order: bool = False

    def test_budget(self, baseline_s: float) -> float:
        return round(max(self.timeout_min_s, self.timeout_factor * baseline_s), 3)

    def mutant_timeout(self, baseline_s: float, budgets: Iterable[float]) -> float:
        """Backstop for a whole judging: every test thrice its baseline time, the
        most its hung tests can spend, and slack for the fork."""
        hangs = worst_hangs(budgets, self.max_hangs)
        return round(3 * baseline_s + hangs + 30.0, 3)


def build_job(
    mutant: Mutant,
    key: str,
    source: str,
    durations: Mapping[str, float],
    options: ExecutorOptions,
) -> Job:
    """The job judging ``mutant`` (``source``: the target's text, for its frame)."""
    tests = mutant.covered_by if options.keep_order else initial_order(mutant, durations)
    budgets = {t: options.test_budget(durations.get(t, 0.0)) for t in tests}
    return Job(
        key=key,
        id=mutant.id,
        function=mutant.function,
        edits=mutant.edits,
        tests=tests,
        budgets=budgets,
        timeout_s=options.mutant_timeout(predicted_cost(mutant, durations), budgets.values()),
        frame=None if mutant.module else function_frame(source, mutant.function),
        module=mutant.module,
        path=mutant.path,
        lines=mutant.changed_lines,
        cost=predicted_cost(mutant, durations),
    )


def initial_order(mutant: Mutant, durations: Mapping[str, float]) -> tuple[str, ...]:
    """``mutant``'s covering tests in the order to run them, before any kill guides it.

    vLLM's own tests come first: a kill by this project's suite then means that no
    test of vLLM's killed it (the report's "vLLM alone" score). Within each suite, the
    tests named after what the mutant changes come first (:func:`name_affinity`),
    then the fastest. A survivor runs them all whatever the order; a killed mutant
    stops at its first failing test.
    """
    affinity = name_affinity(changed_words(mutant.diff), mutant.covered_by)
    return tuple(
        sorted(
            mutant.covered_by,
            key=lambda t: (is_project_test(t), -affinity[t], durations.get(t, 0.0), t),
        )
    )


_NOT_WORDS = frozenset(w.lower() for w in keyword.kwlist) | {
    "self", "cls", "none", "true", "false", "len", "int", "str", "the"
}  # fmt: skip


def words(text: str) -> frozenset[str]:
    """The words of identifiers in ``text``: split at underscores, digits and
    camelCase, lower-cased, three letters or more, Python's keywords and a few
    ubiquitous names left out (``_stale_job_threshold``: stale, job, threshold)."""
    parts = (
        part.lower()
        for identifier in re.findall(r"[A-Za-z][A-Za-z0-9]*", text)
        for part in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", identifier)
    )
    return frozenset(p for p in parts if len(p) > 2 and p not in _NOT_WORDS)


def changed_words(diff: str) -> frozenset[str]:
    """The words of the lines a mutant changes: its diff's removed lines (its added
    ones when it only inserts)."""
    lines = diff.splitlines()
    removed = [line[1:] for line in lines if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in lines if line.startswith("+") and not line.startswith("+++")]
    return words(" ".join(removed or added))


@functools.lru_cache(maxsize=4096)  # a test covers many mutants: its name is read once
def name_words(test_id: str) -> frozenset[str]:
    """The words of a test's function name (its parameters left out)."""
    return words(test_id.rpartition("::")[2].partition("[")[0])


def name_affinity(changed: frozenset[str], tests: Collection[str]) -> dict[str, float]:
    """How much each test's name shares the words of the mutated code, each shared
    word weighted by how few of ``tests`` have it in their name (log n/k: a word in
    every name counts for nothing).

    A test is often named after what it checks: the mutant of
    ``offload_prompt_only=spec.offload_prompt_only`` in vLLM 0.33.0's scheduler is
    killed by ``test_offload_prompt_only``, the 327th of its 346 covering tests in
    duration order. Only the test's function name counts, not its parameters.
    """
    named = {t: name_words(t) & changed for t in tests}
    naming = Counter(word for found in named.values() for word in found)
    n = len(named)
    return {t: math.fsum(math.log(n / naming[w]) for w in sorted(named[t])) for t in named}


def chains(keyed: Iterable[tuple[Mutant, str]], judged: Collection[str]) -> tuple[Chain, ...]:
    """The mutants of each function in a fixed order (first line, then id), for the
    chains of :mod:`audit.testproc.order`; ``keyed``: every mutant with covering tests
    and its verdict's key, ``judged``: the keys judged now (the others are cached).
    A chain with nothing to judge is left out."""
    by_function: dict[tuple[str, str], list[tuple[Mutant, str]]] = {}
    for mutant, key in keyed:
        by_function.setdefault((mutant.module, mutant.function), []).append((mutant, key))
    found = []
    for _, members in sorted(by_function.items()):
        members.sort(key=lambda pair: (min(pair[0].changed_lines, default=0), pair[0].id))
        if any(key in judged for _, key in members):
            found.append(Chain(tuple(Member(key, m.changed_lines) for m, key in members)))
    return tuple(found)


def predicted_cost(mutant: Mutant, durations: Mapping[str, float]) -> float:
    """What judging ``mutant`` may cost at most, in seconds: the baseline durations of
    its covering tests (a survivor runs them all). ``math.fsum`` is exactly rounded,
    so the sum does not depend on the order the tests come in: every process gets the
    same figure from the same durations (the shards' partition relies on it)."""
    return math.fsum(durations.get(test, 0.0) for test in set(mutant.covered_by))


@functools.lru_cache(maxsize=256)  # one per function judged, not one per mutant
def function_frame(source: str, qualname: str) -> Frame | None:
    """Where ``qualname`` sits in ``source``: its lines (decorators included), the
    header lines of its enclosing classes, and the module's imports; what the
    judging fork needs to compile the function alone
    (:func:`audit.testproc.codeswap.function_text`). None: compile the module."""
    tree = _parsed(source)
    node = find_function(tree, qualname)
    if node is None:
        return None
    headers = []
    scope: list[ast.stmt] = tree.body
    for part in qualname.split(".")[:-1]:
        cls = next((n for n in scope if isinstance(n, ast.ClassDef) and n.name == part), None)
        if cls is None or cls.decorator_list:
            return None  # a function nested in a function, or a decorated class
        headers.append((cls.lineno, cls.body[0].lineno - 1))
        scope = cls.body
    # The module's imports come along: CPython compiles ``module.attr()`` differently
    # when ``module`` is a name bound by an import (LOAD_ATTR, not LOAD_METHOD).
    imports = [ast.unparse(n) + "\n" for n in _module_imports(tree.body)]
    future = [line for line in imports if line.startswith("from __future__")]
    prelude = "".join(future + [line for line in imports if line not in future])
    start = first_line(node)
    if any(h[0] <= prelude.count("\n") for h in headers) or start <= prelude.count("\n"):
        return None
    return Frame(start, node.end_lineno or node.lineno, tuple(headers), prelude)


@functools.lru_cache(maxsize=4)
def _parsed(source: str) -> ast.Module:
    """A module's tree, parsed once for all the functions judged in it (never mutated)."""
    return ast.parse(source)


def _module_imports(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Import statements at module level, also inside top-level if/try blocks."""
    for stmt in body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            yield stmt
        elif isinstance(stmt, ast.If | ast.Try):
            for block in (stmt.body, stmt.orelse, getattr(stmt, "finalbody", [])):
                yield from _module_imports(block)
            for handler in getattr(stmt, "handlers", []):
                yield from _module_imports(handler.body)


def forced_failure(source: str, reference: Job) -> Job:
    """A job whose mutant makes ``reference``'s function raise at once: its tests must
    kill it, or no survivor can be trusted.

    ``source`` is the target's; a reference in another module brings its own file."""
    function = reference.function
    if reference.module:
        source = Path(reference.path).read_text(encoding="utf-8")
    node = find_function(_parsed(source), function)
    if node is None:
        raise ExecutorFailed(
            f"forced-fail check: function {function} not found",
            details={
                "module": reference.module or "the audited target",
                "next": "report this bug in fence-audit: its mutants were made from the "
                "same source",
            },
        )
    line = node.body[0].lineno
    text = source.splitlines()[line - 1]
    indent = text[: len(text) - len(text.lstrip())]
    edit = LineEdit(line, line - 1, (f"{indent}raise RuntimeError('fence-audit: forced failure')",))
    return Job(
        key=f"forced-fail-{uuid.uuid4().hex}",
        id=f"{function}:forced-failure",
        function=function,
        edits=(edit,),
        # A few covering tests prove a target mutant switches on. Another module's
        # mutants have no per-line coverage: any test may be the first to run it.
        tests=reference.tests if reference.module else reference.tests[:5],
        budgets=reference.budgets,
        timeout_s=reference.timeout_s,
        module=reference.module,
        path=reference.path,
    )

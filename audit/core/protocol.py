"""Everything that crosses the boundary between fence-audit and a test process.

fence-audit (the parent) and the test process (:mod:`audit.testproc`) share no
memory: the parent writes a *spec* file, the test process reports *events* on its
stdout, receives *commands* on a pipe, and leaves *outcomes* (the baseline's) and
*verdicts* (one file per mutant) on disk. Each of those is a frozen dataclass here,
with its JSON both ways (:func:`to_json`, :func:`from_json`), so mypy checks both
sides of the most fragile contract in the project and a message that does not
match its type is refused (:class:`ProtocolError`) instead of half-read.

This module imports only the standard library: the test process imports it before
vLLM, and nothing else of fence-audit.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import os
import re
import types
import typing
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, TypeVar, Union

# How a test process marks its events (JSON) in its stdout, among pytest's own output.
PROGRESS = "@@fence-audit "
# The first line of the program a Hypothesis state machine shrank to, whatever heading
# Hypothesis gives it ("Falsifying example:", "Failing test case: <state machine>").
EXAMPLE = re.compile(r"^state = \w+\(\)\s*$")
PROJECT_PREFIX = "project/"  # test ids of this project's suite (see audit.setup.suite.stage_suite)

T = TypeVar("T")


class ProtocolError(ValueError):
    """A message that does not match its type: a fence-audit bug, or a damaged file."""


def hang_allowance(first_budget: float, max_hangs: int) -> float:
    """Seconds a judging may spend on hung tests: ``max_hangs`` budgets of the first
    test that hung (the judge stops there)."""
    return max_hangs * first_budget


def worst_hangs(budgets: typing.Iterable[float], max_hangs: int) -> float:
    """The most a judging can spend on hung tests, for the parent's backstop: its
    allowance with its largest budget hung first, and one more hang past it."""
    return (max_hangs + 1) * max(budgets, default=0.0)


def is_project_test(test_id: str) -> bool:
    return test_id.startswith(PROJECT_PREFIX)


# --- values ------------------------------------------------------------------------


class TestOutcome(StrEnum):
    __test__ = False  # not a pytest test class
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    XFAILED = "xfailed"

    @property
    def is_red(self) -> bool:
        return self in (TestOutcome.FAILED, TestOutcome.ERROR)


class MutantStatus(StrEnum):
    KILLED = "killed"
    SURVIVED = "survived"
    TIMEOUT = "timeout"
    NO_TESTS = "no_tests"  # no test of the suite executes the mutated lines
    ERROR = "error"  # the mutant could not be judged (crash, does not compile, ...)
    EQUIVALENT = "equivalent"  # survived or reached by no test, and reviewed as equivalent


@dataclass(frozen=True, slots=True)
class LineEdit:
    """Replace lines ``start..end`` (1-based, inclusive; ``end = start - 1`` inserts)."""

    start: int
    end: int
    new_lines: tuple[str, ...]


def apply_edits(source: str, edits: tuple[LineEdit, ...]) -> str:
    """``source`` with ``edits`` applied; line numbers refer to the original."""
    return "".join(edited_lines(source.splitlines(keepends=True), edits))


def edited_lines(lines: list[str], edits: tuple[LineEdit, ...]) -> list[str]:
    """``lines`` (a text's, ends kept) with ``edits`` applied, as a new list: the lines
    no edit touches are the same objects as in ``lines``, and the new ones are split
    as ``str.splitlines`` splits them (an edit's line holding a line break is two)."""
    lines = list(lines)
    for edit in sorted(edits, key=lambda e: e.start, reverse=True):
        new = "".join(text + "\n" for text in edit.new_lines)
        lines[edit.start - 1 : edit.end] = new.splitlines(keepends=True)
    return lines


# --- specs: what a test process is asked to do ---------------------------------------


@dataclass(frozen=True, slots=True)
class BaselineSpec:
    """Run the suite under coverage, a context per test; then wait for a command."""

    kind: ClassVar[str] = "baseline"
    overlay: dict[str, str]  # module -> file served in its place (a checkout's target)
    include: tuple[str, ...]  # the files coverage measures
    data_file: str
    outcomes: str  # where the :class:`Outcomes` go
    pytest_args: tuple[str, ...]
    command_fd: int | None = None  # the command pipe; None: exit after the baseline
    # The module of the measured file: coverage starts as it is imported, so the
    # modules imported before it (most of vLLM) load untraced. Empty: from the start.
    measure_from: str = ""
    # Processes the tests are dealt to: this one and workers - 1 forks of it, taken
    # once the session is collected (each measures its own tests, then all is merged).
    workers: int = 1
    # Run only the tests of these files (the rest is read from the baseline cache);
    # every test is still collected, for the mutants. Empty: run them all.
    run_only: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PlainRunSpec:
    """Run the selected tests once, unmeasured (the benchmark's fresh process per mutant)."""

    kind: ClassVar[str] = "plain"
    overlay: dict[str, str]
    select: tuple[str, ...]  # test ids, in this order
    pytest_args: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Frame:
    """Where a function sits in its module: what compiling it alone needs
    (:func:`audit.testproc.codeswap.function_text`)."""

    start: int  # first line (decorators included)
    end: int
    headers: tuple[tuple[int, int], ...]  # first and last header line of each enclosing class
    prelude: str  # the module's import statements, ``__future__`` first


@dataclass(frozen=True, slots=True)
class Job:
    """One mutant to judge: its edits, where they apply, and the tests to run."""

    key: str  # the verdict's file name in the results folder (its cache key)
    id: str
    function: str
    edits: tuple[LineEdit, ...]
    tests: tuple[str, ...]  # in the order to run them
    budgets: dict[str, float]  # test id -> seconds before the test counts as hung
    timeout_s: float  # the whole judging's backstop, for a hang no alarm interrupts
    frame: Frame | None = None  # None: compile the whole module
    module: str = ""  # another module than the target, and its file; empty: the target
    path: str = ""
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # set in its fork
    lines: tuple[int, ...] = ()  # the lines it changes (the original's numbers)
    cost: float = 0.0  # predicted seconds at most: its tests' baseline durations


@dataclass(frozen=True, slots=True)
class Member:
    """A mutant of a :class:`Chain`: its verdict's file name (cache key) and its lines."""

    key: str
    lines: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Chain:
    """The mutants of one function, in a fixed order. A job of the chain runs first the
    tests that killed the members before it (audit.testproc.order), so it waits for
    their verdicts; a member judged in an earlier run has its verdict in the cache."""

    members: tuple[Member, ...]


@dataclass(frozen=True, slots=True)
class MutationSpec:
    """Judge ``jobs`` after the forced-fail check, ``workers`` forks at a time."""

    kind: ClassVar[str] = "mutation"
    overlay: dict[str, str]
    pytest_args: tuple[str, ...]
    warm_up: tuple[str, ...]  # tests to run once before the first fork (a new process)
    target_module: str
    target_path: str
    results_dir: str
    workers: int
    max_hangs: int
    jobs: tuple[Job, ...]
    forced_fail: Job  # raises at once: must be killed, or no survivor can be trusted
    whole_failure: bool  # keep a failure's Hypothesis example whole (the deep look's)
    chains: tuple[Chain, ...] = ()  # a job in no chain waits for nothing


Spec = BaselineSpec | PlainRunSpec | MutationSpec
_SPECS: dict[str, type[Spec]] = {s.kind: s for s in (BaselineSpec, PlainRunSpec, MutationSpec)}


def write_spec(path: Path, spec: Spec) -> None:
    # Compact: a whole module's spec names each job's tests and budgets, 2,019 jobs of
    # up to 346 tests on vLLM's scheduler (json's indenting encoder is pure Python).
    path.write_text(json.dumps({"kind": spec.kind, **to_json(spec)}))


def read_spec(path: Path) -> Spec:
    data = json.loads(path.read_text(encoding="utf-8"))
    kind = data.pop("kind", None) if isinstance(data, dict) else None
    if kind not in _SPECS:
        raise ProtocolError(f"{path}: unknown spec kind {kind!r}")
    return from_json(_SPECS[kind], data)


# --- commands: the parent to a warm test process --------------------------------------


@dataclass(frozen=True, slots=True)
class Command:
    action: typing.Literal["mutate", "exit"]
    spec: str = ""  # with ``mutate``: the :class:`MutationSpec` file


EXIT = Command("exit")


# --- results left on disk ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    """One mutant's verdict, as the judging process reached it (one file each).

    Only a verdict is ever written: killed, survived, timeout, or an error the mutant
    itself caused (it does not compile, its function cannot be swapped). A judging
    that was interrupted, or whose process died without a verdict, leaves no file."""

    status: MutantStatus
    killed_by: str = ""  # test id
    failure: str = ""  # the tail of the killing test's failure, or the error
    tests_run: tuple[str, ...] = ()
    duration_s: float = 0.0
    # the tests stopped as hung before the verdict, each as "test id why": a timeout's
    # and a kill's alike (a mutant that makes some tests spin often makes a later fail)
    hung: tuple[str, ...] = ()


def save_verdict(path: Path, verdict: Verdict) -> None:
    """Write atomically (temp file + rename): a reader never sees half a verdict."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(to_json(verdict)))
    tmp.replace(path)


def load_verdict(path: Path) -> Verdict:
    """The verdict in ``path``; OSError if absent, ProtocolError if damaged."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ProtocolError(f"{path}: {error}") from None
    return from_json(Verdict, data)


@dataclass(frozen=True, slots=True)
class TestResult:
    __test__ = False  # not a pytest test class
    test_id: str  # pytest node id
    outcome: TestOutcome
    duration_s: float
    failure: str = ""  # the last lines of pytest's report, when red


@dataclass(frozen=True, slots=True)
class Outcomes:
    """The baseline's outcome, per test, as the test process saw it."""

    exit_code: int
    collected: int
    collection_errors: tuple[tuple[str, str], ...]  # (node id, the report's last lines)
    tests: tuple[TestResult, ...]
    # Every collected test id, in order, when only some ran (``BaselineSpec.run_only``):
    # where the tests read from the baseline cache go among them.
    order: tuple[str, ...] = ()


# --- events: a test process's progress, on its stdout -------------------------------


@dataclass(frozen=True, slots=True)
class BaselineDone:
    """Coverage saved and outcomes written; the process now waits for a command
    (:class:`Command`), unless the baseline was red."""

    kind: ClassVar[str] = "baseline_done"
    exit_code: int  # pytest's


@dataclass(frozen=True, slots=True)
class MissingTests:
    """Covering tests the process did not collect: nothing can be judged."""

    kind: ClassVar[str] = "missing_tests"
    tests: tuple[str, ...]  # the first few
    count: int


@dataclass(frozen=True, slots=True)
class Warmed:
    """Every covering test has run once in this process: forks start warm from here.

    Threads are counted before and after: a test that left one running would make
    forking hazardous."""

    kind: ClassVar[str] = "warmed"
    collected: int  # tests of the session
    tests: int  # run in the warm-up (in the baseline's process: those only its forks ran)
    threads: int
    seconds: float = 0.0
    threads_before: int = 0
    red: tuple[str, ...] = ()  # tests that failed in the warm-up (the first ten)
    huge_mb: int = 0  # memory then moved to huge pages (audit.testproc.hugepages)
    huge_s: float = 0.0  # what moving it took


@dataclass(frozen=True, slots=True)
class ForcedFailChecked:
    """The forced-fail check's verdict: anything but killed, and no mutant is judged."""

    kind: ClassVar[str] = "forced_fail_checked"
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class Judged:
    """One mutant is judged: its verdict is in its file; or, when the judging failed
    for a reason that is not the mutant's (``status`` error, ``failure`` the reason),
    there is no file, so that nothing but a verdict is ever cached."""

    kind: ClassVar[str] = "judged"
    id: str
    status: MutantStatus
    child_s: float | None = None  # inside the judging fork
    wall_s: float | None = None  # fork to reaped, as the pool saw it
    failure: str = ""  # why there is no verdict file


@dataclass(frozen=True, slots=True)
class Done:
    """Every verdict is written; what is left is pytest's teardown."""

    kind: ClassVar[str] = "done"


Event = BaselineDone | MissingTests | Warmed | ForcedFailChecked | Judged | Done
_EVENTS: dict[str, type[Event]] = {
    e.kind: e for e in (BaselineDone, MissingTests, Warmed, ForcedFailChecked, Judged, Done)
}


def event_line(event: Event) -> str:
    return PROGRESS + json.dumps({"event": event.kind, **to_json(event)}) + "\n"


def parse_event(line: str) -> Event | None:
    """The event on a line of a test process's output; None on a line of pytest's own.

    pytest's progress dots may precede the marker on the same line."""
    if PROGRESS not in line:
        return None
    data = json.loads(line.split(PROGRESS, 1)[1])
    kind = data.pop("event", None)
    if kind not in _EVENTS:
        raise ProtocolError(f"unknown event {kind!r}")
    return from_json(_EVENTS[kind], data)


# --- JSON both ways -----------------------------------------------------------------


_PLAIN = (str, int, float, bool)  # JSON's own scalars: written and read back as they are


def to_json(value: Any) -> Any:
    """A message as JSON-ready data: dataclasses as objects, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        if all(type(v) in _PLAIN for v in value):  # test ids: no element to convert
            return list(value)
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        if all(type(k) is str and type(v) in _PLAIN for k, v in value.items()):
            return dict(value)
        return {str(k): to_json(v) for k, v in value.items()}
    return value


def from_json(cls: type[T], data: Any) -> T:
    """``data`` read back as a ``cls``; ProtocolError naming the first field that does
    not fit (a missing one, an unknown one, or a value of the wrong type)."""
    return typing.cast(T, _decode(cls, data, cls.__name__))


def _decode(hint: Any, data: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return _decode_dataclass(typing.cast(type, hint), data, where)
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
        if data is None and type(None) in options:
            return None
        (inner,) = (o for o in options if o is not type(None))
        return _decode(inner, data, where)
    if origin is typing.Literal:
        if data not in typing.get_args(hint):
            raise ProtocolError(f"{where}: {data!r} is not one of {typing.get_args(hint)}")
        return data
    if origin is tuple:
        args = typing.get_args(hint)
        _expect(isinstance(data, list), data, "a list", where)
        if len(args) == 2 and args[1] is Ellipsis:
            if args[0] in _PLAIN and all(type(v) is args[0] for v in data):
                return tuple(data)  # every item fits: none to decode one by one
            return tuple(_decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
        _expect(len(data) == len(args), data, f"{len(args)} items", where)
        return tuple(
            _decode(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data, strict=True))
        )
    if origin is dict:
        _, value_hint = typing.get_args(hint)
        _expect(isinstance(data, dict), data, "an object", where)
        if value_hint in _PLAIN and all(type(v) is value_hint for v in data.values()):
            return dict(data)  # every value fits as it is
        return {k: _decode(value_hint, v, f"{where}[{k!r}]") for k, v in data.items()}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(data)
        except ValueError:
            raise ProtocolError(f"{where}: {data!r} is not a {hint.__name__}") from None
    if hint is float:
        _expect(isinstance(data, int | float) and not isinstance(data, bool), data, hint, where)
        return float(data)
    if hint in (int, str, bool):
        _expect(type(data) is hint, data, hint, where)
        return data
    raise ProtocolError(f"{where}: no decoder for {hint!r}")  # a type this module lacks


@functools.cache
def _fields(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field[Any]]]:
    """A message class's field types and fields, worked out once per class."""
    return typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls)}


def _decode_dataclass(cls: type, data: Any, where: str) -> Any:
    _expect(isinstance(data, dict), data, "an object", where)
    hints, fields = _fields(cls)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ProtocolError(f"{where}: unexpected field {unknown[0]!r}")
    values = {}
    for name, spec in fields.items():
        if name in data:
            values[name] = _decode(hints[name], data[name], f"{where}.{name}")
        elif spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{where}: missing field {name!r}")
    return cls(**values)


def _expect(ok: bool, data: Any, wanted: Any, where: str) -> None:
    if not ok:
        name = wanted.__name__ if isinstance(wanted, type) else wanted
        raise ProtocolError(f"{where}: expected {name}, got {type(data).__name__}")

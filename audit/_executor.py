"""The warm process: vLLM imported and the suite collected once, one fork per mutant.

Run as ``python -m audit._executor SPEC.json`` by :mod:`audit.executor`, in the
hermetic environment and staged suite root of the baseline. pytest collects the
suite once; then, instead of pytest's own run loop, each mutant is judged in a
forked child that swaps in the mutated code of one function (its ``__code__``,
so every reference to the function sees it) and runs only the mutant's covering
tests, stopping at the first failure. Each child writes its verdict to its own
file, atomically; the parent enforces timeouts and reports progress on stdout.

The parent never runs a test, so no test starts threads (torch's pools, vLLM's
helpers) in it before it forks.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import signal
import sys
import threading
import time
import types
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _pytest.runner import runtestprotocol

from audit import hermetic, overlay
from audit.model import PROGRESS, LineEdit, apply_edits, is_project_test
from audit.regions import find_code

FAILURE_LINES = 15


def resolve_function(module: types.ModuleType, qualname: str) -> types.FunctionType:
    """The live function object ``qualname`` of ``module`` (methods unwrapped)."""
    obj: Any = module
    for part in qualname.split("."):
        obj = vars(obj)[part]
    for attribute in ("__func__", "fget", "__wrapped__"):
        obj = getattr(obj, attribute, obj)
    if not isinstance(obj, types.FunctionType):
        raise TypeError(f"{qualname} is a {type(obj).__name__}, not a function")
    return obj


def activate(module_name: str, path: str, qualname: str, text: str) -> None:
    """Swap the code of one function for its code in ``text`` (the mutated module)."""
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    mutated = find_code(compile(text, path, "exec"), qualname)
    resolve_function(module, qualname).__code__ = mutated


def function_text(source: str, edits: tuple[LineEdit, ...], frame: dict[str, Any]) -> str | None:
    """The mutated function alone, compilable in place of the whole module.

    ``frame`` (from :func:`audit.executor.function_frame`) holds the function's lines
    and the header lines of its enclosing classes. The text keeps every line where it
    was (blank lines in between) and the class nesting, so the code object has the
    same qualified name, line numbers, name mangling and ``__class__`` cell as the
    module's own; compiling ~100 lines instead of the module's ~2,500 saves tens of
    milliseconds per mutant. None when an edit reaches outside the function.
    """
    start, end = frame["start"], frame["end"]
    if any(not (start <= e.start and e.end <= end) and e.start != end + 1 for e in edits):
        return None
    lines = source.splitlines(keepends=True)
    body = "".join(lines[start - 1 : end])
    shifted = tuple(LineEdit(e.start - start + 1, e.end - start + 1, e.new_lines) for e in edits)
    mutated = apply_edits(body, shifted)
    parts = [frame["future"]]
    line = 1 + frame["future"].count("\n")
    for header_start, header_end in frame["headers"]:
        parts.append("\n" * (header_start - line))
        parts.append("".join(lines[header_start - 1 : header_end]))
        line = header_end + 1
    parts.append("\n" * (start - line))
    parts.append(mutated)
    return "".join(parts)


def write_result(results: Path, key: str, result: dict[str, Any]) -> None:
    tmp = results / f".{key}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(result))
    tmp.replace(results / f"{key}.json")


def _tail(text: str) -> str:
    lines = text.splitlines()
    return "\n".join(lines[-FAILURE_LINES:])


class MutationLoop:
    """A pytest plugin that replaces the run loop with the mutant loop."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.results = Path(spec["results_dir"])
        self.source = Path(spec["target_path"]).read_text()
        # Kills so far, per function and per test: a test that killed a mutant of a
        # function is tried first on the next mutants of that function.
        self.kills: dict[str, Counter[str]] = defaultdict(Counter)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        self.judge_all(session, warm_up=True)
        return True

    def judge_all(self, session: pytest.Session, *, warm_up: bool) -> None:
        """The mutant loop over a collected session (warmed up here unless it already is)."""
        items = {item.nodeid: item for item in session.items}
        self.results.mkdir(parents=True, exist_ok=True)
        emit({"event": "collected", "tests": len(items), "threads": _os_threads()})
        missing = sorted({t for m in self.spec["mutants"] for t in m["tests"]} - set(items))
        if missing:
            emit({"event": "missing_tests", "tests": missing[:20], "count": len(missing)})
            return
        if warm_up:
            self.warm_up(items)
        else:
            emit({"event": "warmed", "tests": 0, "threads": _os_threads()})
        sentinel = self.spec.get("sentinel")
        if sentinel:
            # Prove that a mutant really switches on before trusting any survivor.
            self.run_pool(items, [sentinel])
            verdict = json.loads((self.results / f"{sentinel['key']}.json").read_text())
            (self.results / f"{sentinel['key']}.json").unlink()
            emit({"event": "sentinel", "status": verdict["status"], "detail": verdict})
            if verdict["status"] != "killed":
                return
        self.run_pool(items, self.spec["mutants"])
        # Every verdict is written: what is left (pytest's session teardown, the
        # interpreter's exit) is of no use, and the caller may kill us now.
        emit({"event": "done"})

    def warm_up(self, items: dict[str, pytest.Item]) -> None:
        """Run every covering test once here, so each child starts fully warm.

        A test's first run in a process pays one-time work (lazy imports, caches,
        up to 2 s for some of vLLM's tests); paid once here, every child inherits
        it and runs each test at its steady-state speed. The baseline proved these
        tests green. Thread counts before and after are reported: a test that left
        threads running would make forking hazardous.
        """
        threads = _os_threads()
        started = time.monotonic()
        red = []
        for test_id in self.spec["warm_up"]:
            reports = runtestprotocol(items[test_id], nextitem=None, log=False)
            if any(r.failed for r in reports):
                red.append(test_id)
        emit(
            {
                "event": "warmed",
                "tests": len(self.spec["warm_up"]),
                "seconds": round(time.monotonic() - started, 3),
                "threads_before": threads,
                "threads": _os_threads(),
                "red": red[:10],
            }
        )

    def run_pool(self, items: dict[str, pytest.Item], mutants: list[dict[str, Any]]) -> None:
        queue: Iterator[dict[str, Any]] = iter(mutants)
        running: dict[int, tuple[dict[str, Any], float, float]] = {}
        jobs = max(1, int(self.spec["jobs"]))
        exhausted = False
        while running or not exhausted:
            while not exhausted and len(running) < jobs:
                mutant = next(queue, None)
                if mutant is None:
                    exhausted = True
                    break
                mutant["tests"] = self.prioritised(mutant)
                started = time.monotonic()
                pid = os.fork()
                if pid == 0:
                    self.child(items, mutant)  # never returns
                running[pid] = (mutant, started, started + mutant["timeout_s"])
            pid, status = os.waitpid(-1, os.WNOHANG) if running else (0, 0)
            now = time.monotonic()
            if pid:
                mutant, started, _ = running.pop(pid)
                self.settled(mutant, status, now - started)
                continue
            for pid, (mutant, started, deadline) in list(running.items()):
                if now > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    running.pop(pid)
                    write_result(
                        self.results,
                        mutant["key"],
                        {
                            "status": "timeout",
                            "failure": f"no verdict within {mutant['timeout_s']:.1f}s",
                            "duration_s": round(now - started, 3),
                        },
                    )
                    emit({"event": "judged", "id": mutant["id"], "status": "timeout"})
            time.sleep(0.005)

    def settled(self, mutant: dict[str, Any], status: int, duration: float) -> None:
        result_file = self.results / f"{mutant['key']}.json"
        if not result_file.is_file():
            reason = (
                f"killed by signal {os.WTERMSIG(status)}"
                if os.WIFSIGNALED(status)
                else f"exit status {os.waitstatus_to_exitcode(status)}"
            )
            write_result(
                self.results,
                mutant["key"],
                {
                    "status": "error",
                    "failure": f"the judging process ended without a verdict ({reason})",
                    "duration_s": round(duration, 3),
                },
            )
        verdict = json.loads(result_file.read_text())
        if verdict["status"] == "killed":
            self.kills[mutant["function"]][verdict["killed_by"]] += 1
        emit(
            {
                "event": "judged",
                "id": mutant["id"],
                "status": verdict["status"],
                "child_s": verdict.get("duration_s"),  # inside the child
                "wall_s": round(duration, 3),  # fork to reaped, as the parent saw it
            }
        )

    def prioritised(self, mutant: dict[str, Any]) -> list[str]:
        """The mutant's tests, the ones that killed its function's other mutants first.

        Only the order within each suite changes: vLLM's tests still run before this
        project's, so that a kill by the project's means no test of vLLM's killed it.
        """
        kills = self.kills[mutant["function"]]
        tests: list[str] = mutant["tests"]
        position = {t: i for i, t in enumerate(tests)}
        return sorted(tests, key=lambda t: (is_project_test(t), -kills[t], position[t]))

    def child(self, items: dict[str, pytest.Item], mutant: dict[str, Any]) -> None:
        # Every object inherited from the warm parent (vLLM, torch, the collected
        # session) goes to the permanent generation: the child's collections then
        # walk only what its tests allocate, not the whole inherited heap (and do
        # not touch, so copy, its pages). Measured on the sliding_window region,
        # 49 mutants: mutant phase 17.7 s -> 13.0-13.8 s.
        gc.freeze()
        code = 0
        started = time.monotonic()
        result: dict[str, Any]
        try:
            edits = tuple(LineEdit(a, b, tuple(new)) for a, b, new in mutant["edits"])
            if mutant.get("module"):  # another module than the target (the worker's)
                module, path = mutant["module"], mutant["path"]
                source = Path(path).read_text()
            else:
                module, path, source = (
                    self.spec["target_module"],
                    self.spec["target_path"],
                    self.source,
                )
            activate(module, path, mutant["function"], apply_edits(source, edits))
            result = self.judge(items, mutant["tests"], mutant["budgets"])
        except BaseException as error:  # the verdict must reach the parent
            result = {"status": "error", "failure": f"{type(error).__name__}: {error}"}
            code = 1
        result["duration_s"] = round(time.monotonic() - started, 3)
        try:
            write_result(self.results, mutant["key"], result)
        finally:
            os._exit(code)

    def judge(
        self, items: dict[str, pytest.Item], tests: list[str], budgets: dict[str, float]
    ) -> dict[str, Any]:
        """Run tests until one fails; a test over its time budget counts as hung.

        Killed if a test fails; timeout if none fails but one hung (or
        ``max_hangs`` hung: then the judging stops there); survived otherwise.
        """
        run: list[str] = []
        hung: list[str] = []
        for test_id in tests:
            run.append(test_id)
            with time_budget(budgets[test_id]) as alarm:
                reports = runtestprotocol(items[test_id], nextitem=None, log=False)
            if alarm.fired:
                hung.append(test_id)
                if len(hung) >= self.spec["max_hangs"]:
                    break
                continue
            failed = next((r for r in reports if r.failed), None)
            if failed is not None:
                return {
                    "status": "killed",
                    "killed_by": test_id,
                    "failure": _tail(failed.longreprtext),
                    "tests_run": run,
                }
        if hung:
            budget = ", ".join(f"{t} > {budgets[t]:.1f}s" for t in hung)
            return {"status": "timeout", "failure": f"hung: {budget}", "tests_run": run}
        return {"status": "survived", "tests_run": run}


class TestHung(BaseException):
    """Raised into a test that overran its budget (a BaseException: code under test
    that catches ``Exception`` must not swallow it)."""

    __test__ = False


class _Alarm:
    fired = False


@contextlib.contextmanager
def time_budget(seconds: float) -> Iterator[_Alarm]:
    alarm = _Alarm()

    def expire(signum: int, frame: types.FrameType | None) -> None:
        alarm.fired = True
        raise TestHung(f"fence-audit: test exceeded its {seconds:.1f}s budget")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield alarm
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def emit(event: dict[str, Any]) -> None:
    sys.__stdout__.write(PROGRESS + json.dumps(event) + "\n")  # type: ignore[union-attr]
    sys.__stdout__.flush()  # type: ignore[union-attr]


def _os_threads() -> int:
    try:
        return len(list(Path("/proc/self/task").iterdir()))
    except OSError:
        return threading.active_count()


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    if spec["overlay"]:
        overlay.install({name: Path(file) for name, file in spec["overlay"].items()})
    hermetic.block_network()
    return int(pytest.main(spec["pytest_args"], plugins=[MutationLoop(spec)]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

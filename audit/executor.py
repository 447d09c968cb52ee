"""Judging mutants: the result cache, the warm executor process, timeouts, progress.

Results are cached by (engine version, vLLM version, the mutated function's source
hash, mutant id, hash of the covering tests' code); each verdict is its own file,
written atomically by the process that reached it, so a run stopped by Ctrl-C,
SIGTERM or SIGKILL resumes where it stopped and never reads half a result.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audit.baseline import Suite, WarmSession, pytest_args, spawn
from audit.config import Config
from audit.errors import AuditError, ExitCode, MutantsInert
from audit.hermetic import child_environment, prepare_hf_home
from audit.model import (
    PROGRESS,
    LineEdit,
    Mutant,
    MutantResult,
    MutantStatus,
    Target,
    is_project_test,
)
from audit.progress import ProgressBar
from audit.regions import find_function, first_line

ENGINE_VERSION = 2  # bump when a verdict's meaning changes: old cache entries then miss


@dataclass(frozen=True, slots=True)
class ExecutorOptions:
    jobs: int = os.cpu_count() or 1
    timeout_factor: float = 10.0  # a test's budget: this times its baseline duration,
    timeout_min_s: float = 10.0  # and never less than this
    max_hangs: int = 3  # hung tests after which a mutant is judged TIMEOUT at once
    use_cache: bool = True

    def test_budget(self, baseline_s: float) -> float:
        return round(max(self.timeout_min_s, self.timeout_factor * baseline_s), 3)

    def mutant_timeout(self, baseline_s: float, budgets: Iterable[float]) -> float:
        """Backstop for a whole judging: every test thrice its baseline time, the
        largest budgets spent on hangs, and slack for the fork."""
        hangs = sum(sorted(budgets, reverse=True)[: self.max_hangs])
        return round(3 * baseline_s + hangs + 30.0, 3)


class ExecutorFailed(AuditError):
    exit_code = ExitCode.INTERNAL


def judge(
    config: Config,
    suite: Suite,
    target: Target,
    mutants: Iterable[Mutant],
    function_hashes: Mapping[str, str],
    durations: Mapping[str, float],
    vllm_version: str,
    options: ExecutorOptions,
    warm: WarmSession | None = None,
) -> dict[str, MutantResult]:
    """A verdict for every mutant: from the cache, or from the warm executor.

    ``warm`` is the baseline's test process, kept alive: judging in it saves a new
    process the import, the collection and the warm-up. Without it (or when it is
    gone) a new executor process is started. ``warm`` is closed either way.
    """

    results_dir = config.cache_dir / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    # Leftovers of a run killed mid-way: never read, so safe to drop.
    for leftover in [*results_dir.glob(".*.tmp"), *results_dir.glob("sentinel-*.json")]:
        leftover.unlink(missing_ok=True)
    hasher = TestHasher(suite.root, suite.plugins)
    verdicts: dict[str, MutantResult] = {}
    pending: list[dict[str, Any]] = []
    target_source = target.path.read_text(encoding="utf-8")
    frames: dict[str, dict[str, Any] | None] = {}
    for mutant in mutants:
        if not mutant.covered_by:
            verdicts[mutant.id] = MutantResult(mutant.id, MutantStatus.NO_TESTS)
            continue
        function = f"{mutant.module}:{mutant.function}" if mutant.module else mutant.function
        key = cache_key(vllm_version, function_hashes[function], mutant, hasher)
        cached = results_dir / f"{key}.json"
        if options.use_cache and cached.is_file():
            verdicts[mutant.id] = _load(mutant.id, cached, cached=True)
            continue
        cached.unlink(missing_ok=True)
        # vLLM's own tests first, fastest first: a kill by this project's suite then
        # means that no test of vLLM's killed it (the report's "vLLM alone" score).
        tests = sorted(
            mutant.covered_by, key=lambda t: (is_project_test(t), durations.get(t, 0.0), t)
        )
        budgets = {t: options.test_budget(durations.get(t, 0.0)) for t in tests}
        if not mutant.module and mutant.function not in frames:
            frames[mutant.function] = function_frame(target_source, mutant.function)
        pending.append(
            {
                "key": key,
                "id": mutant.id,
                "function": mutant.function,
                "module": mutant.module,
                "path": mutant.path,
                "frame": None if mutant.module else frames[mutant.function],
                "edits": [[e.start, e.end, list(e.new_lines)] for e in mutant.edits],
                "tests": tests,
                "budgets": budgets,
                # The whole judging's backstop, for a hang no alarm can interrupt.
                "timeout_s": options.mutant_timeout(
                    sum(durations.get(t, 0.0) for t in tests), budgets.values()
                ),
            }
        )
    if pending:
        _run_executor(config, suite, target, pending, results_dir, durations, options, warm)
    elif warm is not None:
        warm.close()
    for entry in pending:
        verdicts[entry["id"]] = _load(entry["id"], results_dir / f"{entry['key']}.json")
    return verdicts


def cache_key(vllm_version: str, function_hash: str, mutant: Mutant, hasher: TestHasher) -> str:
    material = [
        ENGINE_VERSION,
        vllm_version,
        function_hash,
        mutant.id,
        [[e.start, e.end, list(e.new_lines)] for e in mutant.edits],
        hasher.tests_hash(mutant.covered_by),
    ]
    return hashlib.sha256(json.dumps(material).encode()).hexdigest()[:32]


class TestHasher:
    """Hash of the code a set of tests runs: their files and the helpers beside them.

    A test's file, every ``conftest.py`` on its way up to the suite root, and the
    non-test modules in its folder (vLLM's ``utils.py`` harness) count; a change in
    any of them re-judges the mutants those tests cover. So do the suite's pytest
    plugins, which every test runs under.
    """

    __test__ = False

    def __init__(self, root: Path, plugins: Iterable[Path] = ()) -> None:
        self.root = root
        self._files: dict[Path, str] = {}
        self._test_files: dict[str, list[Path]] = {}  # test file -> the files it depends on
        self._plugins = sorted(plugins)

    def tests_hash(self, test_ids: Iterable[str]) -> str:
        digest = hashlib.sha256()
        for plugin in self._plugins:
            digest.update(str(plugin.relative_to(self.root)).encode())
            digest.update(self._file_hash(plugin).encode())
        for test_id in sorted(test_ids):
            digest.update(test_id.encode())
            for path in self._files_of(test_id.split("::", 1)[0]):
                digest.update(self._file_hash(path).encode())
        return digest.hexdigest()

    def _files_of(self, relpath: str) -> list[Path]:
        # Hundreds of test ids share one file: look its folder up once.
        if relpath not in self._test_files:
            self._test_files[relpath] = self._find_files(relpath)
        return self._test_files[relpath]

    def _find_files(self, relpath: str) -> list[Path]:
        path = self.root / relpath
        files = [path]
        folder = path.parent
        files.extend(sorted(p for p in folder.glob("*.py") if not p.name.startswith("test_")))
        while folder != self.root and self.root in folder.parents:
            folder = folder.parent
            if (folder / "conftest.py").is_file():
                files.append(folder / "conftest.py")
        return files

    def _file_hash(self, path: Path) -> str:
        if path not in self._files:
            data = path.read_bytes() if path.is_file() else b""
            self._files[path] = hashlib.sha256(data).hexdigest()
        return self._files[path]


def function_frame(source: str, qualname: str) -> dict[str, Any] | None:
    """Where ``qualname`` sits in ``source``: its lines (decorators included), the
    header lines of its enclosing classes, and the module's ``__future__`` imports;
    what the executor needs to compile the function alone
    (:func:`audit._executor.function_text`)."""
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
        headers.append([cls.lineno, cls.body[0].lineno - 1])
        scope = cls.body
    # The module's imports come along: CPython compiles ``module.attr()`` differently
    # when ``module`` is a name bound by an import (LOAD_ATTR, not LOAD_METHOD).
    imports = [ast.unparse(n) + "\n" for n in _module_imports(tree.body)]
    future = [line for line in imports if line.startswith("from __future__")]
    prelude = "".join(future + [line for line in imports if line not in future])
    start = first_line(node)
    if any(h[0] <= prelude.count("\n") for h in headers) or start <= prelude.count("\n"):
        return None
    return {"start": start, "end": node.end_lineno, "headers": headers, "future": prelude}


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


def forced_failure(source: str, reference: dict[str, Any]) -> dict[str, Any]:
    """A mutant that makes ``reference``'s function raise at once: its tests must kill it.

    ``source`` is the target's; a reference in another module brings its own file."""
    function = reference["function"]
    if reference.get("module"):
        source = Path(reference["path"]).read_text(encoding="utf-8")
    node = find_function(_parsed(source), function)
    if node is None:
        raise ExecutorFailed(f"forced-fail check: function {function} not found")
    line = node.body[0].lineno
    text = source.splitlines()[line - 1]
    indent = text[: len(text) - len(text.lstrip())]
    edit = LineEdit(line, line - 1, (f"{indent}raise RuntimeError('fence-audit: forced failure')",))
    return {
        "key": f"sentinel-{uuid.uuid4().hex}",
        "id": f"{function}:forced-failure",
        "function": function,
        "module": reference.get("module", ""),
        "path": reference.get("path", ""),
        "edits": [[edit.start, edit.end, list(edit.new_lines)]],
        # A few covering tests prove a target mutant switches on. Another module's
        # mutants have no per-line coverage: any test may be the first to run it.
        "tests": reference["tests"] if reference.get("module") else reference["tests"][:5],
        "budgets": reference["budgets"],
        "timeout_s": reference["timeout_s"],
    }


def _run_executor(
    config: Config,
    suite: Suite,
    target: Target,
    pending: list[dict[str, Any]],
    results_dir: Path,
    durations: Mapping[str, float],
    options: ExecutorOptions,
    warm: WarmSession | None = None,
) -> None:
    work = config.reports_dir / ".work"
    log = config.reports_dir / "logs" / "mutants.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    source = target.path.read_text()
    # The forced-fail check prefers a mutant of the target, whose tests are known to reach it.
    first = next((entry for entry in pending if not entry["module"]), pending[0])
    spec = {
        "overlay": {target.module: str(target.path)} if suite.source.checkout else {},
        # Native tracebacks: pytest's own long format costs ~0.5 s per killed mutant.
        "pytest_args": [*pytest_args(suite, work), "--tb=native"],
        "warm_up": sorted({t for entry in pending for t in entry["tests"]}),
        "target_module": target.module,
        "target_path": str(target.path),
        "results_dir": str(results_dir),
        "jobs": options.jobs,
        "max_hangs": options.max_hangs,
        "mutants": pending,
        "sentinel": forced_failure(source, first),
    }
    spec_file = work / "executor-spec.json"
    spec_file.write_text(json.dumps(spec))
    progress = ProgressBar(len(pending))
    sentinel: dict[str, Any] | None = None
    missing: dict[str, Any] | None = None
    with log.open("w") as out:
        if warm is not None and warm.process.poll() is None:
            warm.send({"command": "mutate", "spec": str(spec_file)})
            process = warm.process
        else:
            process = spawn(config, suite, "audit._executor", spec_file)
        assert process.stdout is not None
        try:
            for line in process.stdout:
                if PROGRESS not in line:
                    out.write(line)
                    continue
                event = json.loads(line.split(PROGRESS, 1)[1])
                out.write(line)
                if event["event"] == "judged":
                    progress.update(event["status"])
                elif event["event"] == "warmed":
                    progress.start()
                elif event["event"] == "sentinel":
                    sentinel = event
                elif event["event"] == "missing_tests":
                    missing = event
                elif event["event"] == "done":
                    break
            if process.poll() is None:
                process.kill()  # only pytest's teardown was left
            returncode = process.wait()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            progress.close()
    if missing is not None:
        raise ExecutorFailed(
            f"{missing['count']} covering tests were not collected by the executor",
            details={"first": missing["tests"][0], "log": str(log)},
        )
    if sentinel is None:
        raise ExecutorFailed(
            f"the executor ended (exit {returncode}) before the forced-fail check",
            details={"log": str(log), "next": "read the log's last lines"},
        )
    if sentinel["status"] != "killed":
        raise MutantsInert(
            "the forced-fail check failed: a mutant that raises at once was not killed",
            details={
                "function": first["function"],
                "verdict": sentinel["status"],
                "log": str(log),
                "next": "mutants do not switch on; no survivor could be trusted",
            },
        )


def _load(mutant_id: str, path: Path, *, cached: bool = False) -> MutantResult:
    if not path.is_file():
        return MutantResult(mutant_id, MutantStatus.ERROR, failure="no verdict was recorded")
    data = json.loads(path.read_text())
    return MutantResult(
        id=mutant_id,
        status=MutantStatus(data["status"]),
        killed_by=data.get("killed_by", ""),
        failure=data.get("failure", ""),
        tests_run=tuple(data.get("tests_run", ())),
        duration_s=float(data.get("duration_s", 0.0)),
        cached=cached,
    )


def judge_with_mutmut(
    config: Config,
    suite: Suite,
    target: Target,
    mutants: Iterable[Mutant],
    options: ExecutorOptions,
) -> dict[str, MutantResult]:
    """The same mutants judged by mutmut's own runner, for cross-checking the engine."""
    from audit import mutmut_adapter

    work = config.reports_dir / ".work"
    project = work / "mutmut"
    mutmut_adapter.stage_project(
        project,
        module=target.module,
        source=target.path.read_text(),
        installed_package=_package_root(target),
        tests_root=suite.root,
        test_paths=[p for p in suite.paths if not p.startswith("project/")],
        pytest_args=["-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning"],
    )
    chosen = [m for m in mutants if m.covered_by]
    names = {mutmut_adapter.mutmut_name(target.module, m.function, m.ordinal): m for m in chosen}
    hf_home = prepare_hf_home(config.cache_dir, config.offline_models)
    started = time.monotonic()
    statuses = mutmut_adapter.run_mutmut(
        project,
        sorted(names),
        jobs=options.jobs,
        env=child_environment(os.environ, hf_home),
        log=config.reports_dir / "logs" / "mutmut.log",
    )
    elapsed = time.monotonic() - started
    verdicts = {m.id: MutantResult(m.id, MutantStatus.NO_TESTS) for m in mutants}
    for name, mutant in names.items():
        status = statuses.get(name)
        verdicts[mutant.id] = MutantResult(
            mutant.id,
            MutantStatus(status) if status else MutantStatus.ERROR,
            failure="" if status else "mutmut recorded no verdict",
            duration_s=round(elapsed / max(len(names), 1), 3),
        )
    return verdicts


def _package_root(target: Target) -> Path:
    """The installed top-level package folder of the target (site-packages/vllm)."""
    depth = len(target.module.split(".")) - 1
    return target.installed_path.parents[depth - 1]

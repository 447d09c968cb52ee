"""The verdict cache: one file per judged mutant, keyed by everything its verdict
depends on.

A key covers the engine version, the vLLM version, the mutated function's source
hash, the mutant (id and edits), the code its covering tests run
(:class:`TestHasher`), and the environment its test process gets that a test can
read: the inherited variables of :func:`audit.baseline.cache.inherited_environment`
(``HYPOTHESIS_PROFILE``, say) and what a second look's fork sets. Each verdict is its
own file, written atomically by the process that reached it
(:func:`audit.core.protocol.save_verdict`), so a run stopped by Ctrl-C, SIGTERM or SIGKILL
resumes where it stopped and never reads half a verdict.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from audit.core import cache
from audit.core.protocol import MutantStatus, ProtocolError, Verdict, load_verdict
from audit.setup.model import Mutant, MutantResult

ENGINE_VERSION = 11  # bump when a verdict's meaning changes: old cache entries then miss
DAMAGED = "the verdict file does not hold a verdict"


class VerdictCache:
    """``CACHE/results/``: where verdicts are looked up, and where the executor writes."""

    def __init__(self, directory: Path, hasher: TestHasher, vllm_version: str) -> None:
        self.directory = directory
        self.hasher = hasher
        self.vllm_version = vllm_version
        directory.mkdir(parents=True, exist_ok=True)
        # Leftovers of a run killed mid-way (half-written files, the forced-fail
        # check's verdict, see audit.judging.jobs.forced_failure): never read, so safe to drop.
        for leftover in [*directory.glob(".*.tmp"), *directory.glob("forced-fail-*.json")]:
            leftover.unlink(missing_ok=True)

    def key(
        self,
        mutant: Mutant,
        function_hash: str,
        environment: Mapping[str, str],
        *,
        given_order: bool = False,
    ) -> str:
        """The key of ``mutant``'s verdict. ``given_order``: its tests run in the order
        given (ExecutorOptions.keep_order), a verdict kept apart from the usual one."""
        material = [
            ENGINE_VERSION,
            self.vllm_version,
            function_hash,
            mutant.id,
            [[e.start, e.end, list(e.new_lines)] for e in mutant.edits],
            self.hasher.tests_hash(mutant.covered_by),
            sorted(environment.items()),
        ]
        if given_order:  # appended: the usual keys stay as they were
            material.append(["order", list(mutant.covered_by)])
        return hashlib.sha256(json.dumps(material).encode()).hexdigest()[:32]

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def has(self, key: str) -> bool:
        return self.path(key).is_file()

    def lookup(self, mutant_id: str, key: str) -> MutantResult | None:
        """The cached verdict, or None (and no file left) when there is none, or when
        the file does not hold a verdict (damaged by hand or by a disk): judged again."""
        verdict = self._read(key)
        if verdict is None:
            self.forget(key)
            return None
        cache.used(self.path(key))
        return _result(mutant_id, verdict, cached=True)

    def forget(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def load(
        self, mutant_id: str, key: str, *, cached: bool = False, failure: str = ""
    ) -> MutantResult:
        """The verdict under ``key``; an error result (never cached) when there is none,
        with ``failure`` saying why, or when the file does not hold one."""
        if not self.has(key):
            why = failure or "no verdict was recorded"
            return MutantResult(mutant_id, MutantStatus.ERROR, failure=why)
        verdict = self._read(key)
        if verdict is None:
            return MutantResult(mutant_id, MutantStatus.ERROR, failure=DAMAGED)
        return _result(mutant_id, verdict, cached=cached)

    def _read(self, key: str) -> Verdict | None:
        """The verdict under ``key``; None when there is no file or it holds no verdict."""
        try:
            return load_verdict(self.path(key))
        except (OSError, ProtocolError):
            return None


def _result(mutant_id: str, verdict: Verdict, *, cached: bool) -> MutantResult:
    return MutantResult(
        id=mutant_id,
        status=verdict.status,
        killed_by=verdict.killed_by,
        failure=verdict.failure,
        tests_run=verdict.tests_run,
        duration_s=verdict.duration_s,
        cached=cached,
        hung=verdict.hung,
    )


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
        self._by_tests: dict[tuple[str, ...], str] = {}

    def tests_hash(self, test_ids: Iterable[str]) -> str:
        # Many mutants share their covering tests: each set is hashed once.
        key = tuple(test_ids)
        if key not in self._by_tests:
            self._by_tests[key] = self._tests_hash(key)
        return self._by_tests[key]

    def _tests_hash(self, test_ids: Iterable[str]) -> str:
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

"""The baseline's cache: outcomes and coverage of a green baseline, kept by its inputs.

A baseline (the suite under coverage, :mod:`audit.baseline.run`) depends on the audited
source, the test files it runs and the code they load beside them (conftests, helper
modules, plugins), the selection, the environment the test process inherits, the
findings file, and the versions of vLLM and of fence-audit. All of them make the key
(:func:`baseline_inputs`); a run with the same key reads the outcomes and the
coverage data back instead of starting a test process. Only a baseline that ended
green (or red only through registered findings) is kept: a red one stops the audit,
and is never read back.

Each entry is a folder ``CACHE/baselines/KEY/`` written whole or not at all. Beside
the entries, ``last-SELECTION.json`` holds the inputs of the newest entry for a
selection, so that a miss can say which inputs changed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from audit.core import cache
from audit.core.files import replaced_dir, write_json
from audit.core.protocol import TestResult, from_json, to_json
from audit.setup.model import BaselineRun
from audit.setup.suite import Suite

FORMAT = 1  # bump when an entry's layout or meaning changes
# The inherited environment that can change what a test does (the Hypothesis
# profile, vLLM's switches, pytest's own); the rest (PATH, HOME, ...) cannot here.
ENV_PREFIXES = ("HYPOTHESIS_", "VLLM_", "PYTEST_", "FENCE_")
ENV_IGNORED = frozenset(
    {
        "FENCE_AUDIT_CACHE",  # where the cache is, not what is tested
        "PYTEST_CURRENT_TEST",  # set by a pytest that runs fence-audit: not the suite's
    }
)


@dataclass(frozen=True, slots=True)
class CachedBaseline:
    tests: tuple[TestResult, ...]
    exit_code: int  # pytest's
    duration_s: float  # of the run that made the entry
    coverage: Path  # its coverage data file
    log: Path


@dataclass(frozen=True, slots=True)
class Rerun:
    """A baseline that runs only some test files again; the rest is read from ``kept``."""

    kept: CachedBaseline
    files: tuple[str, ...]  # relative to the suite root: changed, new or gone
    why: tuple[str, ...]


def baseline_inputs(
    suite: Suite,
    target_path: Path,
    target_sha256: str,
    vllm_version: str,
    findings_file: Path | None,
    environ: Mapping[str, str],
) -> dict[str, str]:
    """Every input of the baseline, by name: a file's sha256, or a value."""
    inputs = {
        "format": str(FORMAT),
        "fence-audit": _package_hash(),
        "vLLM": vllm_version,
        "audited source": f"{target_path} sha256 {target_sha256}",
        "selection": json.dumps(suite.paths),
        # not the origin, which says whether the sdist came from the cache this time
        "vLLM tests": suite.source.identity or suite.source.origin,
        "findings": _file_hash(findings_file) if findings_file is not None else "none",
    }
    for name, value in inherited_environment(environ).items():  # by name: a rerun says which
        inputs[f"environment {name}"] = value
    for path in _suite_files(suite):
        inputs[f"file {path.relative_to(suite.root)}"] = _file_hash(path)
    return inputs


def inherited_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that can change what a test does (ENV_PREFIXES),
    sorted by name: an input of the baseline and of every verdict."""
    return {
        name: environ[name]
        for name in sorted(environ)
        if name.startswith(ENV_PREFIXES) and name not in ENV_IGNORED
    }


def key_of(inputs: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(inputs.items())).encode()).hexdigest()[:32]


class BaselineCache:
    """``CACHE/baselines/``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def load(self, inputs: Mapping[str, str]) -> CachedBaseline | None:
        """The entry for ``inputs``; None when there is none or it is damaged."""
        entry = self.directory / key_of(inputs)
        try:
            data = json.loads((entry / "outcomes.json").read_text(encoding="utf-8"))
            if data["inputs"] != dict(inputs):  # a key collision, or a hand-made entry
                return None
            tests = tuple(from_json(TestResult, t) for t in data["tests"])
            cached = CachedBaseline(
                tests,
                int(data["exit_code"]),
                float(data["duration_s"]),
                entry / "baseline.coverage",
                entry / "baseline.log",
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not (cached.coverage.is_file() and cached.log.is_file()):
            return None
        cache.used(entry)
        cache.used(self._last(inputs))
        return cached

    def save(self, inputs: Mapping[str, str], run: BaselineRun, exit_code: int) -> None:
        """Keep a baseline that the audit accepted (green, or red by findings alone)."""
        entry = self.directory / key_of(inputs)
        with replaced_dir(entry) as staging:
            shutil.copyfile(run.data_file, staging / "baseline.coverage")
            shutil.copyfile(run.log, staging / "baseline.log")
            write_json(
                staging / "outcomes.json",
                {
                    "inputs": dict(inputs),
                    "exit_code": exit_code,
                    "duration_s": run.duration_s,
                    "tests": [to_json(t) for t in run.tests],
                },
            )
        write_json(self._last(inputs), dict(inputs))

    def html_dir(self, inputs: Mapping[str, str]) -> Path:
        """Where the entry of ``inputs`` keeps the coverage HTML of its data."""
        return self.directory / key_of(inputs) / "coverage-html"

    def changed_since_last(self, inputs: Mapping[str, str]) -> list[str]:
        """What differs from the newest entry of the same selection: why it runs again.
        Empty when there is no such entry (a first run)."""
        last = self._last_inputs(inputs)
        if last is None:
            return []
        names = sorted(set(last) | set(inputs))
        return [_why(name, last, inputs) for name in names if last.get(name) != inputs.get(name)]

    def partial(self, inputs: Mapping[str, str], suite: Suite) -> Rerun | None:
        """When the only inputs changed since the newest entry of the same selection are
        test files that no other file of the suite names (so imports), that entry and
        the files to run again; None when the whole baseline must run."""
        last = self._last_inputs(inputs)
        if last is None:
            return None
        changed = sorted(n for n in set(last) | set(inputs) if last.get(n) != inputs.get(n))
        files = [name.removeprefix("file ") for name in changed]
        if not changed or any(
            not name.startswith("file ") or not Path(f).name.startswith("test_")
            for name, f in zip(changed, files, strict=True)
        ):
            return None
        for name in inputs:
            other = name.removeprefix("file ")
            if name.startswith("file ") and other not in files:
                text = (suite.root / other).read_text(encoding="utf-8", errors="replace")
                if any(re.search(rf"\b{re.escape(Path(f).stem)}\b", text) for f in files):
                    return None  # it may import a changed test module
        kept = self.load(last)
        if kept is None:
            return None
        return Rerun(kept, tuple(files), tuple(_why(n, last, inputs) for n in changed))

    def _last_inputs(self, inputs: Mapping[str, str]) -> dict[str, str] | None:
        """The inputs of the newest entry of the same selection, if there is one."""
        try:
            last = json.loads(self._last(inputs).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return last if isinstance(last, dict) else None

    def _last(self, inputs: Mapping[str, str]) -> Path:
        selection = hashlib.sha256(inputs["selection"].encode()).hexdigest()[:16]
        return self.directory / f"last-{selection}.json"


def _why(name: str, last: Mapping[str, str], now: Mapping[str, str]) -> str:
    if name not in last:
        return f"{name} is new"
    if name not in now:
        return f"{name} is gone"
    if name == "audited source":
        before, _, old = last[name].rpartition(" sha256 ")
        new = now[name].rpartition(" sha256 ")[2]
        if old == new:  # the same text at another path (another checkout or environment)
            return f"audited source moved (same sha256), was {before}"
        return f"audited source changed (sha256 {old[:12]} before, {new[:12]} now)"
    return f"{name} changed"


def _suite_files(suite: Suite) -> list[Path]:
    """The Python files the selection runs and loads beside it: every file under a
    selected folder, a selected file and its folder's helper modules, the conftests
    on the way up to the suite root, the plugins. vLLM's tests from an sdist are
    known by the sdist's sha256 (``vLLM tests``), so only a checkout's are read."""
    files: set[Path] = set(suite.plugins)
    for selected in suite.paths:
        path = suite.root / selected.partition("::")[0]
        if not suite.source.checkout and not selected.startswith("project/"):
            continue
        if path.is_dir():
            files.update(_python_files(path))
            folder = path
        else:
            files.add(path)
            folder = path.parent
            files.update(p for p in folder.glob("*.py") if not p.name.startswith("test_"))
        while folder != suite.root and suite.root in folder.parents:
            folder = folder.parent
            if (folder / "conftest.py").is_file():
                files.add(folder / "conftest.py")
    return sorted(files)


def _python_files(folder: Path) -> Iterable[Path]:
    for parent, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        yield from (Path(parent) / n for n in names if n.endswith(".py"))


def _file_hash(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "missing"


@functools.cache
def _package_hash() -> str:
    """fence-audit's own code (its test process's too): any change re-runs the baseline."""
    root = Path(__file__).resolve().parents[1]  # the whole package
    digest = hashlib.sha256()
    for path in sorted(_python_files(root)):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()

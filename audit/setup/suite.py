"""The suite root: vLLM's tests and this project's, staged where pytest runs them.

See DESIGN.md, "The suite root": ``tests/`` mirrors vLLM's tests folder by symlinks
(all but its root ``conftest.py``), ``project`` links to this repository, so test ids
are short and the same on every machine.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from audit.core.errors import ConfigError
from audit.core.protocol import PROJECT_PREFIX
from audit.setup.config import Config, SuitePath
from audit.setup.sources import TestSource

STAGED = ".fence-audit-suite"  # in every suite root stage_suite lays out: the one it may remove


@dataclass(frozen=True, slots=True)
class Suite:
    """The selected test paths, inside a staged suite root that pytest runs from."""

    source: TestSource
    root: Path  # the staged root: tests/ (vLLM's) and project/ (this repository)
    paths: tuple[str, ...]  # relative to root; node ids keep any ::test part
    selection: tuple[str, ...]  # the configured entries (and plugins), for messages
    plugins: tuple[Path, ...] = ()  # pytest plugin files, inside root


def stage_suite(
    config: Config, source: TestSource, entries: tuple[SuitePath, ...], work: Path
) -> Suite:
    """Lay out one root holding vLLM's tests and this project's, then select paths.

    ``tests/`` mirrors vLLM's tests folder by symlinks, all but its root
    ``conftest.py`` (LLM runners, media assets: heavy, and not needed by the fence
    suite); ``project`` links to this repository. Test ids are then stable and
    short (``tests/v1/...::test_x``, ``project/tests/fence/...``), and vLLM's own
    ``vllm/`` folder, in a checkout, never lands on ``sys.path``.
    """
    root = work / "suite"
    _remove_staged(root)
    root.mkdir(parents=True)
    (root / STAGED).write_text("a suite root staged by fence-audit, rebuilt whole by each run\n")
    (root / "tests").mkdir()
    for child in (source.root / "tests").iterdir():
        if child.name not in ("conftest.py", "__pycache__"):
            (root / "tests" / child.name).symlink_to(child)
    (root / "project").symlink_to(config.project_dir)

    paths: list[str] = []
    for entry in entries:
        prefix = "" if entry.root == "vllm" else PROJECT_PREFIX
        file_part, sep, test_part = entry.path.partition("::")  # a node id selects one test
        if (root / prefix / file_part).exists():
            paths.append(f"{prefix}{file_part}{sep}{test_part}")
        elif not entry.optional:
            base = source.root if entry.root == "vllm" else config.project_dir
            raise ConfigError(
                f"suite path {entry} does not exist",
                details={
                    "looked in": str(base / file_part),
                    "vLLM tests": source.origin,
                    "next": "fix [tool.fence-audit.suite] paths or --suite",
                },
            )
    plugins = tuple(_stage_plugin(root, config, source, entry) for entry in config.plugins)
    selection = (*(str(e) for e in entries), *(f"plugin {e}" for e in config.plugins))
    return Suite(source, root, tuple(paths), selection, plugins)


def _remove_staged(root: Path) -> None:
    """Remove the suite root a run staged before (its test processes wrote in it too, so
    it goes whole), known by its marker; refuse any other folder in its place."""
    if not (root.exists() or root.is_symlink()):
        return
    if root.is_symlink() or not (root / STAGED).is_file():
        with contextlib.suppress(OSError):
            root.rmdir()  # empty: a run stopped before it wrote the marker
            return
        raise ConfigError(
            f"the suite folder is not a suite root fence-audit staged: it holds no {STAGED}",
            details={
                "folder": str(root),
                "next": "move it away; fence-audit rebuilds this folder whole",
            },
        )
    shutil.rmtree(root)


def _stage_plugin(root: Path, config: Config, source: TestSource, entry: SuitePath) -> Path:
    path = root / ("" if entry.root == "vllm" else "project") / entry.path
    if path.suffix != ".py" or not path.is_file():
        base = source.root if entry.root == "vllm" else config.project_dir
        raise ConfigError(
            f"pytest plugin {entry} is not a Python file",
            details={
                "looked in": str(base / entry.path),
                "next": "fix [tool.fence-audit.suite] plugins or --plugin (one .py file each)",
            },
        )
    return path

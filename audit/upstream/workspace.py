"""Where the upstream checks work: the release's tests and installed package, and the
trees built from them under ``reports/upstream/work/``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from audit.core.environment import installed_vllm
from audit.core.files import write_text
from audit.setup.config import Config
from audit.setup.sources import sdist_file, sdist_tests
from audit.upstream.trees import build_tree


@dataclass(frozen=True, slots=True)
class Workspace:
    config: Config
    release: str  # the installed vLLM, which the checks run on
    tests_root: Path  # the release's tests/, extracted from its sdist into the cache
    vllm_package: Path  # the installed vllm package folder (never written)
    pyproject: str  # vLLM's pyproject.toml as the release ships it (its pytest markers)
    work: Path  # reports/upstream/work

    def tree(
        self,
        name: str,
        drop_in: Iterable[Path] = (),
        patches: Iterable[Path] = (),
        *,
        tests: bool = True,
        vllm_files: Iterable[str] = (),
    ) -> Path:
        """The tree ``work/name``, built afresh (:func:`audit.upstream.trees.build_tree`):
        with vLLM's tests unless ``tests`` is False, with ``vllm/`` when a patch or a
        file of ``vllm_files`` needs it."""
        tree = build_tree(
            self.work / name,
            tests_root=self.tests_root if tests else None,
            drop_in=drop_in,
            vllm_root=self.vllm_package,
            vllm_files=vllm_files,
            patches=patches,
            release=self.release,
        )
        write_text(tree / "pyproject.toml", self.pyproject)
        return tree


def open_workspace(config: Config, reports: Path) -> Workspace:
    """The workspace of the installed vLLM, which must be ``config``'s version."""
    vllm = installed_vllm(config.vllm_version, config.vllm_version_from)
    tests = sdist_tests(
        vllm.version,
        index_url=config.index_url,
        cache_dir=config.cache_dir,
        version_from=config.vllm_version_from,
    )
    pyproject = sdist_file(
        vllm.version, "pyproject.toml", index_url=config.index_url, cache_dir=config.cache_dir
    )
    return Workspace(
        config=config,
        release=vllm.version,
        tests_root=tests.root,
        vllm_package=vllm.location / "vllm",
        pyproject=pyproject,
        work=reports / "upstream" / "work",
    )

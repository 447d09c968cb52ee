"""The folders the upstream checks run in: vLLM's tests and vLLM itself, patched or not,
built beside the originals, never in them.

A *tree* is a folder laid out as a vLLM checkout: ``tests/`` (the release's own tests,
from the sdist fence-audit caches) with this project's vLLM-idiom test files dropped
into the offloading connector's test folder, and, when patches apply, ``vllm/`` (the
installed package) with the patched files. Both are *mirrors*: every entry is a
symbolic link to the original, except the folders on the way to a file that changes
and that file itself, which are real (a copy, then patched). So a tree costs a few
hundred links, and nothing of the installed vLLM or of the cache is written: the
patch is applied to the copy.

Patches are applied with ``git apply`` (no fuzz; a hunk that does not match where it
says is refused), outside any repository: the tree's parent is the ceiling of git's
search, so the enclosing checkout of fence-audit is never taken for the target.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from audit.core.errors import ConfigError, PatchDoesNotApply

# where vLLM keeps the offloading connector's unit tests; the drop-in files go here
TEST_FOLDER = "tests/v1/kv_connector/unit/offloading_connector"

_PATCHED_FILE = re.compile(r"^\+\+\+ b/(\S+)", re.MULTILINE)
_FAILED_HUNK = re.compile(r"error: patch failed: (\S+:\d+)")


def mirror(source: Path, target: Path, real: Iterable[str]) -> None:
    """Make ``target`` mirror ``source`` with symbolic links; each relative path in
    ``real`` becomes real: its folders are created and link their entries, and a file
    is copied (so it can change without touching ``source``)."""
    target.mkdir(parents=True, exist_ok=True)
    for relative in real:
        parts = Path(relative).parts
        here_source, here_target = source, target
        for depth, part in enumerate(parts):
            _link_entries(here_source, here_target, skip=part)
            here_source, here_target = here_source / part, here_target / part
            last = depth == len(parts) - 1
            if here_target.is_symlink():
                here_target.unlink()
            if last and here_source.is_file():
                shutil.copyfile(here_source, here_target)
            elif last and here_source.is_dir():
                here_target.mkdir(exist_ok=True)
                _link_entries(here_source, here_target)
            elif not last:
                here_target.mkdir(exist_ok=True)
            # a path the source lacks (a file a patch creates) is left to the patch


def _link_entries(source: Path, target: Path, skip: str = "") -> None:
    """Link every entry of ``source`` into ``target`` that is not there yet."""
    if not source.is_dir():
        return
    for entry in source.iterdir():
        if entry.name in (skip, "__pycache__"):
            continue
        link = target / entry.name
        if not link.exists() and not link.is_symlink():
            link.symlink_to(entry)


def patched_files(patch: Path) -> list[str]:
    """The files ``patch`` changes, as paths from the root of a vLLM checkout."""
    return sorted(set(_PATCHED_FILE.findall(patch.read_text(encoding="utf-8"))))


def apply_patch(patch: Path, tree: Path, release: str) -> None:
    """Apply ``patch`` to the files of ``tree`` (already made real by :func:`mirror`);
    one that does not apply is :class:`PatchDoesNotApply`, naming its first failing
    hunk, and changes nothing."""
    if not patched_files(patch):
        raise ConfigError(
            f"{patch.name} changes no file",
            details={"file": str(patch), "next": "write it as `git diff` does (+++ b/PATH)"},
        )
    for step in (["--check"], []):
        done = subprocess.run(
            ["git", "apply", "--verbose", *step, str(patch.resolve())],
            cwd=tree,
            env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.resolve().parent)},
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            hunk = _FAILED_HUNK.search(done.stderr)
            first = hunk.group(1) if hunk else done.stderr.strip().splitlines()[-1:]
            raise PatchDoesNotApply(
                f"the patch {patch.name} does not apply to vLLM {release}",
                details={
                    "file": str(patch),
                    "first failing hunk": str(first) if first else "none reported",
                    "next": f"rebase the patch on vLLM {release}'s file, or leave "
                    "that release out of the upstream checks",
                },
            )


def build_tree(
    target: Path,
    *,
    tests_root: Path | None,
    drop_in: Iterable[Path] = (),
    vllm_root: Path | None = None,
    vllm_files: Iterable[str] = (),
    patches: Iterable[Path] = (),
    release: str,
) -> Path:
    """A vLLM checkout-shaped folder at ``target`` (replaced if there): ``tests_root``'s
    ``tests/`` (none when None) with ``drop_in`` files in :data:`TEST_FOLDER`; with
    ``patches`` or ``vllm_files`` (paths from the checkout's root, ``vllm/...``), also
    ``vllm_root`` (the installed ``vllm`` package) as ``vllm/``, those files and the
    patches' real, each patch applied in order."""
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    if tests_root is not None:
        mirror(tests_root, target, [TEST_FOLDER])
        for file in drop_in:
            shutil.copyfile(file, target / TEST_FOLDER / file.name)
    patches = list(patches)
    changed = sorted({*vllm_files, *(f for p in patches for f in patched_files(p))})
    if changed:
        if vllm_root is None:
            raise ValueError("patched files need the installed vLLM to mirror")
        outside = [f for f in changed if not f.startswith("vllm/")]
        if outside:
            raise ConfigError(
                f"a patch changes {outside[0]}, outside vLLM's package",
                details={"next": "a fix patches vllm/ only; its test is a file of its own"},
            )
        mirror(vllm_root, target / "vllm", [f.removeprefix("vllm/") for f in changed])
        for patch in patches:
            apply_patch(patch, target, release)
    return target

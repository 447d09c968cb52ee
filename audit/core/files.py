"""Writing files and folders so that a reader never sees half of one."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from audit.core.errors import CannotWrite

# What a write can meet that the person running the audit can mend: the disk, the
# permissions, or something else standing where the file goes. Any other OSError is
# fence-audit's own fault, and stays a traceback (exit 70).
_MENDABLE = {
    errno.ENOSPC: "free space on that device (or write elsewhere), then run the same command "
    "again: what was judged is cached",
    errno.EDQUOT: "free space within your quota, then run the same command again: what was "
    "judged is cached",
    errno.EACCES: "make it writable, then run the same command again",
    errno.EPERM: "make it writable, then run the same command again",
    errno.EROFS: "write to a writable file system (--reports, --cache-dir)",
    errno.EISDIR: "move the folder that stands where the file goes",
    errno.ENOTDIR: "move the file that stands where a folder goes",
}


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn an error a person can mend while writing ``path`` (no space left, not
    writable, a folder where the file goes) into one line, exit 18 (:class:`CannotWrite`)."""
    try:
        yield
    except OSError as error:
        if error.errno not in _MENDABLE:
            raise
        raise CannotWrite(
            f"cannot write {path}: {error.strerror or error}",
            details={"path": str(path), "next": _MENDABLE[error.errno]},
        ) from None


def write_json(path: Path, document: Any) -> None:
    """Write ``document`` as JSON: the old file or the new one, never half of one."""
    # Serialised first: an unserialisable document fails before anything is written.
    write_text(path, json_text(document))


def json_text(document: Any) -> str:
    """``document`` as every JSON file of the audit holds it (reports render it in memory):
    its top level and the members of its top-level lists and objects one per line (one
    mutant, one test, one source line a line), each of those on a single line. At file
    scope that is a third smaller than JSON indented throughout, and a line still
    greps and diffs as one record."""
    return _json_lines(document, 0) + "\n"


def _json_lines(value: Any, depth: int) -> str:
    if (
        depth >= 2
        or not isinstance(value, dict | list)
        or not value
        or (isinstance(value, dict) and not all(isinstance(k, str) for k in value))
    ):  # a key json turns into a string is left to json
        return json.dumps(value, ensure_ascii=False)
    pad = " " * (depth + 1)
    if isinstance(value, dict):
        members = [
            f"{pad}{json.dumps(k, ensure_ascii=False)}: {_json_lines(v, depth + 1)}"
            for k, v in value.items()
        ]
        return "{\n" + ",\n".join(members) + "\n" + " " * depth + "}"
    members = [pad + _json_lines(v, depth + 1) for v in value]
    return "[\n" + ",\n".join(members) + "\n" + " " * depth + "]"


def write_text(path: Path, text: str) -> None:
    """Write ``text``: the old file or the new one, never half of one."""
    with writing(path):
        _write_text(path, text)


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # backslashreplace: a lone surrogate (a test's undecodable bytes) is written as
        # its escape, which JSON reads back as the same character
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as out:
            os.fchmod(out.fileno(), 0o644)  # mkstemp's 0600 would hide the report from others
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)  # noqa: PTH105  # the rename is the atomic step
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def replaced_dir(target: Path, *, clear: Callable[[Path], None] = shutil.rmtree) -> Iterator[Path]:
    """Yield an empty staging folder beside ``target``; on success ``clear`` removes the
    old ``target`` (whole, by default) and the staging folder becomes ``target``.

    Whatever fails before ``clear`` leaves ``target`` as it was; the staging folder is
    gone either way.
    """
    with writing(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.part-"))
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the reports from others (CI uploaders)
    try:
        yield staging
        with writing(target):
            if target.exists():
                clear(target)
            staging.replace(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)

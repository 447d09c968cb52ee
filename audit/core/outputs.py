"""The reports folder: what fence-audit wrote there, and the one place that removes from it.

fence-audit removes only files and folders it created. The manifest
(``.fence-audit-manifest.json``, in the reports folder) lists every file and folder
fence-audit wrote there, each recorded before it is written, so a run killed in between
leaves nothing of its own unlisted. A reports folder is fence-audit's when it holds a
manifest; one that does not exist, or holds only dotfiles (the repository's
``.gitkeep``), becomes fence-audit's at the first write; any other is refused by
:func:`check_reports_dir`, before the baseline. A file fence-audit did not write, in a
folder it replaces whole (``regions/``, ``coverage/``) or at a path it writes, is never
deleted or overwritten: the run stops before the baseline and names it. ``.work/`` is listed whole:
the test processes, coverage.py and mutmut write there too. See DESIGN.md, "Output
layout".
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from audit.core.errors import ConfigError
from audit.core.files import replaced_dir, write_json
from audit.core.text import first_of

MANIFEST = ".fence-audit-manifest.json"
# The manifest's format; bump it on any change, and note the change here.
#   1: {"format": 1, "written": [paths under the reports folder, "/"-separated, sorted;
#      a folder's ends in "/"]}
MANIFEST_FORMAT = 1
SCRATCH = ".work/"  # the staged suite root, coverage data, specs, verdicts, mutmut's project
REPLACED = ("coverage/", "regions/")  # replaced whole by each run: every file in them is ours
# Every other path fence-audit writes in a reports folder (DESIGN.md, "Output layout"):
# one that exists and is not listed is someone else's, and would be overwritten.
FILES = (
    "audit.json",
    "bench.json",
    "coverage-map.json",
    "hunt.md",
    "index.html",
    "junit.xml",
    "mutation.json",
    "regions.json",
    "standing-proposed.json",
    "summary.md",
    "logs/baseline.log",
    "logs/mutants.log",
    "logs/mutmut.log",
)


def check_reports_dir(root: Path) -> None:
    """Refuse a reports folder fence-audit cannot write into without losing a file it did
    not write, or cannot write into at all. Writes nothing; run it before the baseline."""
    if root.exists() and not root.is_dir():
        raise ConfigError(
            "the reports folder is a file, not a folder",
            details={"folder": str(root), "next": "choose a folder with --reports"},
        )
    linked = symlinked(root)
    if linked:
        raise ConfigError(
            f"{linked[0]} in the reports folder is a symbolic link: fence-audit would "
            "write through it, outside the folder",
            details={
                "folder": str(root),
                "next": f"remove the link {linked[0]}, or choose another folder with --reports",
            },
        )
    written = _read(root)
    foreign = _unlisted(root, written)
    if foreign:
        raise _foreign_error(root, foreign)
    _check_shapes(root)
    _check_writable(root)


def _check_shapes(root: Path) -> None:
    """Refuse a folder where fence-audit writes a file (``audit.json/``), or a file where
    it writes a folder (``logs``): found now, not after every mutant is judged."""
    for name in (*FILES, SCRATCH, *REPLACED):
        path = root / name.rstrip("/")
        wants_folder = name.endswith("/")
        parents = [root / p for p in Path(name.rstrip("/")).parents[:-1][::-1]]
        blocked = next((q for q in parents if _exists(q) and not q.is_dir()), None)
        if blocked is None and _exists(path) and path.is_dir() != wants_folder:
            blocked = path
        if blocked is not None:
            shape = "a folder" if blocked.is_dir() else "a file"
            where = blocked.relative_to(root).as_posix()
            raise ConfigError(
                f"{where} in the reports folder is {shape} where fence-audit writes "
                f"{'a file' if shape == 'a folder' else 'a folder'}",
                details={
                    "folder": str(root),
                    "next": f"move {where} out of the reports folder, or choose another "
                    "folder with --reports",
                },
            )


LOCK = ".fence-audit.lock"  # held by the one run writing the folder (flock)
_held: dict[Path, int] = {}  # the folders this process holds, by resolved path


def hold(root: Path) -> None:
    """Hold the reports folder for this process until :func:`release_all`: a second
    run on the same folder (its baseline would rebuild .work/ under this one's tests,
    and overwrite the log this one names) stops here, before anything is written."""
    key = root.resolve()
    if key in _held:
        return
    claim(root, LOCK)
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ConfigError(
            "another fence-audit run is writing this reports folder",
            details={
                "folder": str(root),
                "next": "wait for it to end, or give this run its own folder with --reports",
            },
        ) from None
    _held[key] = fd


def release_all() -> None:
    """Let go of every folder :func:`hold` took (the lock file stays, listed as ours)."""
    while _held:
        _, fd = _held.popitem()
        os.close(fd)


def symlinked(root: Path) -> list[str]:
    """The paths fence-audit writes under ``root`` (its files, the folders that hold
    them, its work folder, the manifest) that are symbolic links: each would carry a
    write outside the reports folder."""
    paths = {MANIFEST, LOCK, SCRATCH.rstrip("/"), *(f.rstrip("/") for f in REPLACED)}
    for name in FILES:
        parts = name.split("/")
        paths.update("/".join(parts[:depth]) for depth in range(1, len(parts) + 1))
    return sorted(p for p in paths if (root / p).is_symlink())


def claim(root: Path, *names: str) -> None:
    """List ``names`` (paths under ``root``; a folder's ends in "/") as fence-audit's, with
    the folders above them that do not exist yet, before they are written.

    A folder that exists and is not listed stays unlisted: fence-audit writes into it but
    did not create it, so never removes it.
    """
    written = _read(root) or set()
    new: set[str] = set()
    for name in names:
        parts = name.rstrip("/").split("/")
        new.update(
            folder
            for folder in ("/".join(parts[:depth]) + "/" for depth in range(1, len(parts)))
            if not _exists(root / folder)
        )
        if not (name.endswith("/") and _exists(root / name)):
            new.add(name)
    if not new <= written:
        root.mkdir(parents=True, exist_ok=True)
        _write(root, written | new)


def scratch(root: Path) -> Path:
    """fence-audit's work folder in ``root``, listed whole and created."""
    if _exists(root / SCRATCH) and SCRATCH not in (_read(root) or set()):
        raise _foreign_error(root, [SCRATCH])
    claim(root, SCRATCH)
    folder = root / SCRATCH
    folder.mkdir(exist_ok=True)
    return folder


@contextlib.contextmanager
def replaced_folder(root: Path, name: str) -> Iterator[Path]:
    """Yield an empty staging folder; on success it replaces the folder ``root/name``.

    Of the old folder only what the manifest lists is removed; a file in it fence-audit
    did not write stops the replacement before anything is removed (:func:`check_reports_dir`
    finds it before the baseline already).
    """
    folder = name.rstrip("/") + "/"
    written = _read(root) or set()
    foreign = _unlisted_in(root, folder, written)
    if foreign:
        raise _foreign_error(root, foreign)
    old = {path for path in written if path.startswith(folder)}
    with replaced_dir(root / folder, clear=lambda _: _clear(root, folder, old)) as staging:
        yield staging
        new = {folder, *(folder + _relative(path, staging) for path in staging.rglob("*"))}
        claim(root, *sorted(new))
    _forget(root, old - new)


def remove(root: Path, name: str) -> None:
    """Remove the file ``root/name`` if fence-audit wrote it; leave it otherwise."""
    if name in (_read(root) or set()):
        (root / name).unlink(missing_ok=True)
        _forget(root, {name})


def _read(root: Path) -> set[str] | None:
    """The paths ``root``'s manifest lists; None when it holds none."""
    path = root / MANIFEST
    if not _exists(path):
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise _damaged(path, f"it does not parse: {error}") from None
    found = document.get("format") if isinstance(document, dict) else None
    if found != MANIFEST_FORMAT:
        raise _damaged(path, f"format {found!r}, where this fence-audit reads {MANIFEST_FORMAT}")
    written = document.get("written")
    if not isinstance(written, list):
        raise _damaged(path, '"written" is not a list')
    for entry in written:
        if not (isinstance(entry, str) and _is_relative(entry)):
            raise _damaged(path, f"{entry!r} is not a path inside the folder")
    return set(written)


def _write(root: Path, written: Iterable[str]) -> None:
    write_json(root / MANIFEST, {"format": MANIFEST_FORMAT, "written": sorted(written)})


def _forget(root: Path, names: set[str]) -> None:
    written = _read(root) or set()
    if names & written:
        _write(root, written - names)


def _is_relative(entry: str) -> bool:
    """``entry`` names a path inside the folder: a hostile manifest deletes nothing outside."""
    parts = entry.removesuffix("/").split("/")
    return entry != MANIFEST and "\\" not in entry and all(p not in ("", ".", "..") for p in parts)


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _relative(path: Path, folder: Path) -> str:
    """``path`` under ``folder`` as the manifest lists it (a real folder's ends in "/")."""
    text = path.relative_to(folder).as_posix()
    return text + "/" if path.is_dir() and not path.is_symlink() else text


def _unlisted(root: Path, written: set[str] | None) -> list[str]:
    """What fence-audit would overwrite or remove in ``root`` and did not write."""
    if not root.is_dir():
        return []
    if written is None:  # a folder is fence-audit's only by its manifest; dotfiles aside
        return sorted(
            _relative(path, root)
            for path in root.iterdir()
            if not (path.name.startswith(".") and path.is_file() and not path.is_symlink())
        )
    foreign = [name for name in FILES if _exists(root / name) and name not in written]
    if _exists(root / SCRATCH) and SCRATCH not in written:
        foreign.append(SCRATCH)
    for folder in REPLACED:
        foreign.extend(_unlisted_in(root, folder, written))
    return foreign


def _unlisted_in(root: Path, folder: str, written: set[str]) -> list[str]:
    """What the manifest does not list in ``root/folder``, a folder replaced whole."""
    top = root / folder
    if not _exists(top):
        return []
    if top.is_symlink() or not top.is_dir() or folder not in written:
        return [folder.rstrip("/") if top.is_symlink() or not top.is_dir() else folder]
    foreign = []
    for parent, dirs, files in os.walk(top):  # symbolic links are listed, not followed
        for entry in sorted([*dirs, *files]):
            name = folder + _relative(Path(parent) / entry, top)
            if name not in written:
                foreign.append(name)
                if entry in dirs:
                    dirs.remove(entry)  # one line for the folder, not one per file in it
    return foreign


def _clear(root: Path, folder: str, names: set[str]) -> None:
    """Remove the listed ``names`` of ``root/folder`` (files, then folders deepest first,
    the folder last), and nothing else."""
    for name in sorted(names, key=lambda n: (n.endswith("/"), -n.count("/"))):
        path = root / name
        if name.endswith("/"):
            with contextlib.suppress(OSError):
                path.rmdir()  # not when someone put a file into it since the check
        else:
            path.unlink(missing_ok=True)
    if _exists(root / folder):
        raise _foreign_error(root, _unlisted_in(root, folder, {folder}))


def _check_writable(root: Path) -> None:
    existing = next(p for p in (root, *root.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(
            "the reports folder cannot be created: a path above it is a file",
            details={
                "folder": str(root),
                "file": str(existing),
                "next": "choose another folder with --reports",
            },
        )
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".fence-audit-probe-")
    except OSError as error:
        raise ConfigError(
            "the reports folder is not writable",
            details={
                "folder": str(root),
                "error": f"{error.strerror}: {existing}",
                "next": "make it writable, or choose another folder with --reports",
            },
        ) from None
    os.close(fd)
    Path(probe).unlink()


def _foreign_error(root: Path, foreign: list[str]) -> ConfigError:
    shown = first_of(foreign, 5)
    return ConfigError(
        "the reports folder holds files fence-audit did not write",
        details={
            "folder": str(root),
            "files": shown,
            "next": "choose an empty folder with --reports, or move them out",
        },
    )


def _damaged(path: Path, reason: str) -> ConfigError:
    return ConfigError(
        "the reports folder's manifest is not one fence-audit can read",
        details={
            "manifest": str(path),
            "error": reason,
            "next": "choose an empty folder with --reports, or move out the files "
            "fence-audit wrote and delete the manifest",
        },
    )

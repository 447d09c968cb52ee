"""The cache folder: what fence-audit keeps there, when a run last used it, and pruning.

Every run adds to the cache: a verdict per mutant judged, a baseline per change of
the audited source or the suite, a release's sdist and tests. Nothing there is ever
wrong to keep (each entry is keyed by all it depends on), so nothing leaves on its
own, and a cache that CI restores and saves on every pull request grows with every
one of them. ``fence-audit cache`` shows it; ``--prune DAYS`` removes the entries no
run has used for DAYS days, ``--max-mb MB`` then the least recently used until the
cache holds at most MB megabytes.

"Used" is each entry's modification time: a run sets it when it reads an entry
(:func:`used`), and writing one sets it too. Pruning removes only what fence-audit
writes, named as it names it (:data:`KINDS`); any other file in the cache folder is
left and counted. The private homes of the test process (``hf-home``,
``vllm-home``) are small and made again on every run: they are left too. An entry
pruned is only work to do again: the next run that needs it judges, runs or
downloads it afresh. Nothing is pruned from a folder without the cache tag
(:data:`TAG`), which a run writes when it first uses the folder, and a run does not
take as its cache a folder without the tag that holds anything fence-audit would not
have written there: a cache pointed by mistake at a project's folder is refused before
anything in it could be mistaken for an entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from audit.core.errors import ConfigError
from audit.core.files import write_text

DAY_S = 86_400.0
_HEX32 = r"[0-9a-f]{32}"
_RELEASE = r"vllm-[0-9A-Za-z.+_-]+"


@dataclass(frozen=True, slots=True)
class Kind:
    """A kind of entry: the folder it lives in and the names fence-audit gives it."""

    name: str
    folder: str
    pattern: str  # an entry's name in the folder, matched whole
    # a file that goes with an entry: its name is the entry's and this suffix
    companion: str = ""


KINDS = (
    Kind("verdicts", "results", rf"{_HEX32}\.json"),  # a mutant's
    Kind("mutations", "mutations", rf"{_HEX32}\.json"),  # one function's, as generated
    # a green baseline; the inputs of a selection's newest
    Kind("baselines", "baselines", rf"{_HEX32}|last-[0-9a-f]{{16}}\.json"),
    Kind("sdists", "sdist", rf"{_RELEASE}\.tar\.gz", companion=".sha256"),  # and its digest
    Kind("tests", "tests", _RELEASE),  # a release's, extracted
    Kind("modules", "modules", _RELEASE),  # a release's audited module, extracted
)
# The cache folder's mark (https://bford.info/cachedir/, which backup tools honour):
# written when a run first uses the folder, and required before anything is pruned.
TAG = "CACHEDIR.TAG"
_SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"
_TAG_TEXT = (
    f"{_SIGNATURE}\n"
    "# This file is a cache directory tag created by fence-audit.\n"
    "# For information about cache directory tags, see https://bford.info/cachedir/\n"
)
# Held shared by every run that uses the cache (from :func:`mark` on), and exclusively
# by a prune: a prune never removes an entry a running audit may be about to read.
LOCK = ".fence-audit.lock"
KEPT = ("hf-home", "vllm-home", "schemas", TAG, LOCK)  # left as they are: see the docstring
# What a run killed mid-way leaves beside an entry: the temporary files of
# ``write_text``, the generator and the verdicts, a download's ``.part`` file,
# ``replaced_dir``'s staging folders, the forced-fail check's verdict
# (audit.judging.jobs.forced_failure).
LEFTOVERS = "leftovers"
_LEFTOVER = re.compile(r"\..+(\.tmp|\.part(-[A-Za-z0-9_]+)?)|forced-fail-[0-9a-f]{32}\.json")


@dataclass(frozen=True, slots=True)
class Entry:
    kind: str
    path: Path
    size: int  # bytes, a folder's whole contents, its companion's too
    used: float  # seconds since the epoch
    companion: Path | None = None  # removed with it


@dataclass(frozen=True, slots=True)
class Contents:
    entries: tuple[Entry, ...]
    foreign: tuple[Path, ...]  # not fence-audit's names: never removed


def used(path: Path) -> None:
    """Note that a run used ``path`` (an entry: a file, or a folder itself), so that
    pruning keeps it. A cache fence-audit may not stamp is still read."""
    with contextlib.suppress(OSError):
        os.utime(path)


def marked(root: Path) -> bool:
    """Whether ``root`` carries the cache tag: a run of fence-audit used it as its cache."""
    try:
        with (root / TAG).open("rb") as tag:
            return tag.read(len(_SIGNATURE)) == _SIGNATURE.encode()
    except OSError:
        return False


def mark(root: Path) -> None:
    """Tag ``root`` as fence-audit's cache (made if missing), and hold it, shared, for
    this process (:data:`LOCK`): a prune waits for no run, it stops."""
    if not marked(root):
        root.mkdir(parents=True, exist_ok=True)
        write_text(root / TAG, _TAG_TEXT)
    _lock(root, fcntl.LOCK_SH)


_held: dict[Path, int] = {}  # the caches this process holds, by resolved path


def _lock(root: Path, how: int) -> None:
    """Take ``root``'s lock (``fcntl.LOCK_SH`` for a run, ``LOCK_EX`` for a prune) for
    this process until :func:`release`, or stop with one line if another process holds
    it the other way."""
    key = root.resolve()
    fd = _held.get(key)
    own = fd is not None
    if fd is None:
        fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)  # held already: converted (a run that prunes)
    except OSError:
        if own:  # a failed conversion may have dropped the lock held: take it back
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        else:
            os.close(fd)
        pruning = how == fcntl.LOCK_EX
        raise ConfigError(
            "a fence-audit run is using this cache" if pruning else "this cache is being pruned",
            details={
                "folder": str(root),
                "next": "prune when no run is using it"
                if pruning
                else "wait for the prune to end, or give this run its own --cache-dir",
            },
        ) from None
    _held[key] = fd


def release(root: Path) -> None:
    """Let go of ``root``, if this process holds it (the lock file stays)."""
    fd = _held.pop(root.resolve(), None)
    if fd is not None:
        os.close(fd)


def release_all() -> None:
    """Let go of every cache this process holds."""
    for root in list(_held):
        release(root)


def contents(root: Path) -> Contents:
    """Every entry in the cache folder ``root``, and what is there that is not one."""
    entries: list[Entry] = []
    foreign: list[Path] = []
    known = {kind.folder: kind for kind in KINDS}
    for top in _listing(root):
        if top.name in KEPT:
            continue
        kind = known.get(top.name)
        if kind is None or not top.is_dir() or top.is_symlink():
            foreign.append(top)
            continue
        listed = list(_listing(top))
        names = {path.name for path in listed}
        for path in listed:
            if _is_companion(path.name, kind) and not _regular(path):
                foreign.append(path)  # fence-audit writes a companion as a file
                continue
            if _is_companion(path.name, kind) and _main_name(path.name, kind) in names:
                continue  # counted with its entry
            name = _kind_of(path.name, kind)
            if name is None or path.is_symlink():
                foreign.append(path)
                continue
            companion = path.with_name(path.name + kind.companion) if kind.companion else None
            if companion is not None and (companion.name not in names or not _regular(companion)):
                companion = None
            size = _size(path) + (_size(companion) if companion else 0)
            entries.append(Entry(name, path, size, path.lstat().st_mtime, companion))
    return Contents(tuple(entries), tuple(foreign))


def _kind_of(name: str, kind: Kind) -> str | None:
    """What ``name``, in ``kind``'s folder, is: a leftover, an entry of ``kind`` (or
    a companion whose entry is gone), or None: not fence-audit's."""
    if _LEFTOVER.fullmatch(name):
        return LEFTOVERS
    if re.fullmatch(kind.pattern, name) or _is_companion(name, kind):
        return kind.name
    return None


def _regular(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _is_companion(name: str, kind: Kind) -> bool:
    return bool(kind.companion) and re.fullmatch(kind.pattern, _main_name(name, kind)) is not None


def _main_name(name: str, kind: Kind) -> str:
    """The name of the entry ``name`` would be the companion of."""
    return name.removesuffix(kind.companion) if name.endswith(kind.companion) else ""


def prune(
    root: Path,
    days: float | None = None,
    *,
    max_bytes: int | None = None,
    now: float | None = None,
    kinds: Iterable[str] | None = None,
) -> tuple[Entry, ...]:
    """Remove the entries of ``root`` (of ``kinds`` only, if given) that no run has used
    for ``days`` days before ``now``; then, while those left hold more than
    ``max_bytes``, the least recently used. Return what went, oldest first.

    Each entry's time is read again just before it goes: one a run used since the
    listing stays."""
    listed = contents(root)
    if listed.entries and not marked(root):
        raise ConfigError(
            f"the cache folder {root} has no {TAG}: no run of fence-audit has used it as its "
            "cache, so nothing there is pruned",
            details={
                "folder": str(root),
                "next": "check --cache-dir, $FENCE_AUDIT_CACHE or [tool.fence-audit] cache-dir; "
                "a cache from before the tag gets it from the next run that uses it",
            },
        )
    if not listed.entries:
        return ()
    held = root.resolve() in _held
    _lock(root, fcntl.LOCK_EX)
    try:
        return _prune(root, listed, days, max_bytes, now, kinds)
    finally:  # back to what this process held before: a run's shared hold, or none
        if held:
            fcntl.flock(_held[root.resolve()], fcntl.LOCK_SH)
        else:
            release(root)


def _prune(
    root: Path,
    listed: Contents,
    days: float | None,
    max_bytes: int | None,
    now: float | None,
    kinds: Iterable[str] | None,
) -> tuple[Entry, ...]:
    wanted = None if kinds is None else frozenset(kinds)
    chosen = [e for e in listed.entries if wanted is None or e.kind in wanted]
    chosen.sort(key=lambda entry: (entry.used, str(entry.path)))
    doomed = []
    if days is not None:
        cutoff = (time.time() if now is None else now) - days * DAY_S
        doomed = [entry for entry in chosen if entry.used < cutoff]
    if max_bytes is not None:
        left = chosen[len(doomed) :]  # sorted: the old ones come first
        held = sum(entry.size for entry in left)
        for entry in left:
            if held <= max_bytes:
                break
            doomed.append(entry)
            held -= entry.size
    removed = []
    for entry in doomed:
        try:
            if entry.path.lstat().st_mtime != entry.used:
                continue  # used meanwhile
        except FileNotFoundError:
            continue  # gone meanwhile
        if entry.path.is_dir():
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            entry.path.unlink(missing_ok=True)
        if entry.companion is not None:
            entry.companion.unlink(missing_ok=True)
        removed.append(entry)
    return tuple(removed)


def megabytes(entries: Iterable[Entry]) -> str:
    return f"{sum(entry.size for entry in entries) / 1e6:.1f}"


def format_contents(entries: Iterable[Entry]) -> str:
    """A line per kind: its entries, their size, and the days they were last used."""
    by_kind: dict[str, list[Entry]] = {}
    for entry in entries:
        by_kind.setdefault(entry.kind, []).append(entry)
    order = [kind.name for kind in KINDS] + [LEFTOVERS]
    rows = [("kind", "entries", "MB", "least recently used", "most recently used")]
    for name in (n for n in order if n in by_kind):
        group = by_kind[name]
        times = [entry.used for entry in group]
        rows.append((name, str(len(group)), megabytes(group), _day(min(times)), _day(max(times))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.rjust(width) if 0 < i < 3 else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    )


def _day(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(seconds)) + " UTC"


def _listing(folder: Path) -> Iterator[Path]:
    try:
        yield from sorted(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return


def _size(path: Path) -> int:
    if not path.is_dir():
        return path.lstat().st_size
    total = 0
    for parent, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_size  # noqa: PTH118
    return total

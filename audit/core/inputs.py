"""The user's files and folders, checked before anything runs.

A file a person gives (the configuration, a catalogue entry, the equivalents) is read
by :func:`read_toml`, so every way it can be unreadable (missing, a folder, not UTF-8,
not TOML) is one :class:`ConfigError` naming the file, never a traceback. The cache
folder is checked before anything is fetched into it.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from audit.core import cache
from audit.core.errors import ConfigError
from audit.core.text import first_of


class NotARegularFile(OSError):
    """A named pipe, socket or device where a file was asked for (its read could block)."""


def regular_file(path: Path) -> Path:
    """``path``, unless it exists as neither a file nor a folder: reading a named pipe
    would wait for a writer for ever. A folder or a missing path is left to the read's
    own error."""
    if path.exists() and not path.is_file() and not path.is_dir():
        raise NotARegularFile(0, "not a regular file (a named pipe, socket or device)")
    return path


def brief(error: object, limit: int = 160) -> str:
    """An exception's message, cut to ``limit`` characters (a 5,000-digit number's
    error would quote advice about interpreter limits the user cannot act on)."""
    text = " ".join(str(error).split()).split("; use sys.set_int_max_str_digits")[0]
    text = text or type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def resolved(path: Path, what: str) -> Path:
    """``path`` made absolute, its links followed; a link that leads back to itself is a
    :class:`ConfigError` naming ``what`` (``Path.resolve`` raises RuntimeError there)."""
    try:
        return path.expanduser().resolve()
    except (RuntimeError, OSError) as error:
        raise ConfigError(
            f"{what} {path} cannot be resolved: a symbolic link loop",
            details={"error": brief(error), "next": f"point {what} at a real file or folder"},
        ) from None


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """The TOML document at ``path``. Whatever keeps it from being read (missing, a
    folder, not UTF-8, not TOML) is a :class:`ConfigError` naming ``what`` and the file."""
    try:
        return tomllib.loads(regular_file(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        problem, error, next_step = "not found", "", "check the path"
    except IsADirectoryError:
        problem, error, next_step = "a folder, not a file", "", "name the file itself"
    except UnicodeDecodeError as exc:
        problem, error = "not UTF-8 text", f"byte {exc.start}: {exc.reason}"
        next_step = "save it as UTF-8 (TOML files are UTF-8 by definition)"
    except OSError as exc:
        problem, error, next_step = "unreadable", exc.strerror or str(exc), "make it readable"
    except tomllib.TOMLDecodeError as exc:
        problem, error, next_step = "not valid TOML", str(exc), "fix it where the error says"
    except (ValueError, RecursionError) as exc:  # a 5,000-digit number; nesting too deep
        problem, error, next_step = "beyond what can be read", brief(exc), "shorten what it says"
    details = {"file": str(path)} | ({"error": error} if error else {}) | {"next": next_step}
    raise ConfigError(f"{what} is {problem}", details=details)


def known_keys(
    table: Mapping[str, object], allowed: Collection[str], what: str, **where: str
) -> None:
    """The one check of a table's keys, for every file a person writes (the
    configuration, a catalogue entry, the findings, the equivalents, the upstream
    series): a key outside ``allowed`` is a :class:`ConfigError` naming the first such
    key, ``what`` holds it and ``where`` it is (``config=`` or ``file=``), and the keys
    allowed there."""
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise ConfigError(
            f"unknown key {unknown[0]!r} in {what}",
            details={
                **where,
                "allowed": ", ".join(sorted(allowed)),
                "next": "correct it to an allowed key, or remove it",
            },
        )


_CACHE_NEXT = "point --cache-dir, $FENCE_AUDIT_CACHE or [tool.fence-audit] cache-dir at "


def check_cache_dir(path: Path, origin: str, *, claim: bool = True) -> None:
    """The cache folder must be a folder fence-audit may write, or one it can create:
    checked before anything is fetched or run, writing nothing. ``origin``: who chose
    it. With ``claim``, a run will use it and tag it (:func:`cache.mark`, when it first
    writes there): an untagged folder must then hold nothing fence-audit did not write."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        problem = "is a file" if existing == path else f"lies inside {existing}, a file"
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = "cannot be written"
    else:
        if claim:
            _claim(path, origin)
        return
    raise ConfigError(
        f"the cache folder {path} {problem}",
        details={"set by": origin, "next": _CACHE_NEXT + "a folder fence-audit may write"},
    )


def _claim(path: Path, origin: str) -> None:
    if path.is_dir() and not cache.marked(path):
        foreign = cache.contents(path).foreign
        if foreign:
            names = first_of([str(p.relative_to(path)) for p in foreign], 3)
            raise ConfigError(
                f"the cache folder {path} holds files fence-audit did not write "
                f"({names}) and no {cache.TAG}",
                details={
                    "set by": origin,
                    "next": _CACHE_NEXT + "an empty folder, or a cache fence-audit made",
                },
            )

"""The user's files and folders, checked before anything runs.

A file a person gives (the configuration, a catalogue entry, the equivalents) is read
by :func:`read_toml`, so every way it can be unreadable (missing, a folder, not UTF-8,
not TOML) is one :class:`ConfigError` naming the file, never a traceback. The cache
folder is checked before anything is fetched into it.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from audit import cache
from audit.errors import ConfigError


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """The TOML document at ``path``. Whatever keeps it from being read (missing, a
    folder, not UTF-8, not TOML) is a :class:`ConfigError` naming ``what`` and the file."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
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
    details = {"file": str(path)} | ({"error": error} if error else {}) | {"next": next_step}
    raise ConfigError(f"{what} is {problem}", details=details)


_CACHE_NEXT = "point --cache-dir, $FENCE_AUDIT_CACHE or [tool.fence-audit] cache-dir at "


def check_cache_dir(path: Path, origin: str, *, claim: bool = True) -> None:
    """The cache folder must be a folder fence-audit may write, or one it can create:
    checked before anything is fetched or run. ``origin``: who chose it. With
    ``claim``, a run is about to use it: it is tagged as fence-audit's cache
    (:func:`cache.mark`), unless, untagged, it holds what fence-audit did not write."""
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
            names = ", ".join(str(p.relative_to(path)) for p in foreign[:3])
            more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            raise ConfigError(
                f"the cache folder {path} holds files fence-audit did not write "
                f"({names}{more}) and no {cache.TAG}",
                details={
                    "set by": origin,
                    "next": _CACHE_NEXT + "an empty folder, or a cache fence-audit made",
                },
            )
    cache.mark(path)

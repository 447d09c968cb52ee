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


def check_cache_dir(path: Path, origin: str) -> None:
    """The cache folder must be a folder fence-audit may write, or one it can create:
    checked before anything is fetched or run. ``origin``: who chose it."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        problem = "is a file" if existing == path else f"lies inside {existing}, a file"
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = "cannot be written"
    else:
        return
    raise ConfigError(
        f"the cache folder {path} {problem}",
        details={
            "set by": origin,
            "next": "point --cache-dir, $FENCE_AUDIT_CACHE or [tool.fence-audit] cache-dir "
            "at a folder fence-audit may write",
        },
    )

"""Writing report files so that a reader never sees half of one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_json(path: Path, document: Any) -> None:
    """Write ``document`` as JSON: the old file or the new one, never half of one."""
    text = json.dumps(document, indent=1, ensure_ascii=False) + "\n"  # fails before any write
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), 0o644)  # mkstemp's 0600 would hide the report from others
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)  # noqa: PTH105  # the rename is the atomic step
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

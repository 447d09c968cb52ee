"""What this machine's kernel can do, for tests that need it."""

from __future__ import annotations

import os
from pathlib import Path


def kernel_collapses() -> bool:
    """Linux 6.1 or later, transparent huge pages not switched off: MADV_COLLAPSE works."""
    release = tuple(int(p) for p in os.uname().release.split("-")[0].split(".")[:2])
    setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return release >= (6, 1) and setting.is_file() and "[never]" not in setting.read_text()

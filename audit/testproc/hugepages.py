"""The warm process's memory in huge pages, so that forking it costs less.

A fork copies one page-table entry per resident 4 KiB page of the parent's private
memory, and its exit drops them all again; the warm process holds about 430 MB of it
(vLLM, torch, the collected session), so each mutant's fork paid that twice. Once the
warm process has run its tests, its private anonymous regions are collapsed into 2 MiB
pages (``madvise(MADV_COLLAPSE)``, Linux 6.1 and later): a fork then copies one entry
per huge page. A child that writes to a huge page still copies only the 4 KiB it
touches (the kernel splits the shared huge page first). Where the kernel cannot
collapse (older, another system, no huge page free), nothing changes. MADV_COLLAPSE
does not depend on the system's transparent-huge-page setting (unless "never").
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from pathlib import Path

MADV_COLLAPSE = 25
HUGE = 2 << 20  # bytes in a huge page (x86-64, arm64 with 4 KiB pages)


@dataclass(frozen=True, slots=True)
class Collapsed:
    regions: int  # regions collapsed
    refused: int  # regions the kernel would not collapse
    megabytes: int  # of memory in the collapsed ranges


def collapse() -> Collapsed:
    """Collapse this process's private anonymous memory into huge pages, where the
    kernel can; return what it did."""
    if not sys.platform.startswith("linux"):
        return Collapsed(0, 0, 0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return Collapsed(0, 0, 0)
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done = refused = size = 0
    for start, end in _anonymous_ranges():
        # Only what is there is collapsed: the range is not marked for huge pages
        # (MADV_HUGEPAGE), so a child's new allocations still get small ones.
        if madvise(start, end - start, MADV_COLLAPSE) == 0:
            done += 1
            size += end - start
        else:
            refused += 1
    return Collapsed(done, refused, size >> 20)


def _anonymous_ranges() -> list[tuple[int, int]]:
    """The huge-page-aligned parts of the private, writable, anonymous mappings (the
    heap's included), at least one huge page long."""
    ranges = []
    with Path("/proc/self/maps").open(encoding="ascii") as maps:
        for line in maps:
            fields = line.split()
            perms = fields[1]
            name = fields[5] if len(fields) > 5 else ""
            if not perms.startswith("rw") or perms[3] != "p" or name not in ("", "[heap]"):
                continue
            low, high = (int(part, 16) for part in fields[0].split("-"))
            start = -(-low // HUGE) * HUGE
            end = high // HUGE * HUGE
            if end - start >= HUGE:
                ranges.append((start, end))
    return ranges

"""The warm process's private memory goes to huge pages before the forks."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest
from kernel import kernel_collapses

from audit.testproc import hugepages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def anon_huge_kb() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def test_the_ranges_are_whole_huge_pages_of_anonymous_writable_memory() -> None:
    ranges = hugepages._anonymous_ranges()

    assert ranges  # a Python process has a heap
    for start, end in ranges:
        assert start % hugepages.HUGE == 0
        assert end % hugepages.HUGE == 0
        assert end - start >= hugepages.HUGE


@pytest.mark.skipif(not kernel_collapses(), reason="MADV_COLLAPSE needs Linux 6.1 and THP")
def test_memory_written_before_is_moved_to_huge_pages_and_keeps_its_bytes() -> None:
    size = 16 << 20
    buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    pattern = bytes(range(256)) * (size // 256)
    buffer.write(pattern)
    before = anon_huge_kb()

    collapsed = hugepages.collapse()

    assert collapsed.regions >= 1
    assert collapsed.megabytes >= 12  # the buffer's aligned part at least
    assert anon_huge_kb() - before >= 12 << 10
    buffer.seek(0)
    assert buffer.read() == pattern

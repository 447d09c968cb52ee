"""A toy fence: a well-tested function, a badly tested one, and an untested one."""

import logging
import threading

logger = logging.getLogger(__name__)


class Fence:
    def __init__(self) -> None:
        self.pending: dict[int, set[int]] = {}

    def register(self, job: int, blocks: list[int]) -> None:
        for block in blocks:
            if block == 0:
                continue
            self.pending.setdefault(block, set()).add(job)

    def remove(self, job: int, blocks: list[int]) -> None:
        for block in blocks:
            jobs = self.pending[block]
            jobs.remove(job)
            if not jobs:
                del self.pending[block]

    def flush(self, allocated: set[int]) -> set[int]:
        return {job for block in allocated if block in self.pending for job in self.pending[block]}

    def drain(self, limit: int) -> int:
        steps = 0
        while steps < limit:
            steps += 1
        return steps

    def handoff(self, turns: int) -> int:
        """Pass a lock from turn to turn; a turn that keeps it blocks the next for ever."""
        baton = threading.Lock()
        passed = 0
        for turn in range(turns):
            baton.acquire()
            if turn >= 0:
                baton.release()
            passed += 1
        return passed

    def busy(self, limit: int = 4) -> bool:
        """Whether ``limit`` blocks or more are fenced."""
        return len(self.pending) >= limit

    def evict(self, block: int) -> bool:
        """Drop a block's jobs; warn when some were still pending."""
        jobs = self.pending.pop(block, set())
        if jobs:
            logger.warning("block %d evicted with %d jobs pending", block, len(jobs))
        return bool(jobs)

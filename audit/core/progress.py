"""A progress bar for the mutant phase: done/total, killed/survived so far, ETA."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import TextIO


class ProgressBar:
    """Redraws one line on a terminal; prints a line per 10% elsewhere (CI logs)."""

    WIDTH = 24

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.counts: Counter[str] = Counter()
        self.started = time.monotonic()
        self.tty = self.stream.isatty()
        self._last_decile = -1

    def start(self) -> None:
        """Start the clock the ETA is measured by (when judging really begins)."""
        self.started = time.monotonic()

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    def update(self, status: str) -> None:
        self.counts[status] += 1
        if self.tty:
            self.stream.write("\r" + self.render())
            self.stream.flush()
        else:
            decile = 10 * self.done // max(self.total, 1)
            if decile != self._last_decile:
                self._last_decile = decile
                self.stream.write(self.render() + "\n")

    def close(self) -> None:
        if self.tty and self.total:
            self.stream.write("\n")

    def render(self) -> str:
        done = self.done
        filled = self.WIDTH * done // max(self.total, 1)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        elapsed = time.monotonic() - self.started
        eta = elapsed / done * (self.total - done) if done else 0.0
        return (
            f"mutants [{bar}] {done}/{self.total}  killed {self.counts['killed']}  "
            f"survived {self.counts['survived']}  timeout {self.counts['timeout']}  "
            f"error {self.counts['error']}  eta {_clock(eta)}"
        )


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    return f"{minutes}:{secs:02d}"

"""The test process's side of the channel: events out on stdout, commands in on a pipe."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

from audit.core.protocol import EXIT, Command, Event, event_line, from_json


def emit(event: Event) -> None:
    """Report ``event`` on the real stdout (pytest's capture owns ``sys.stdout``)."""
    sys.__stdout__.write(event_line(event))  # type: ignore[union-attr]
    sys.__stdout__.flush()  # type: ignore[union-attr]


def read_command(fd: int) -> Command:
    """The one command the parent sends on pipe ``fd``; its end of file means exit."""
    with os.fdopen(fd, "r") as commands:
        line = commands.readline()
    return from_json(Command, json.loads(line)) if line else EXIT


def os_threads() -> int:
    """Threads of this process: forking is safe only while no test left one running."""
    try:
        return len(list(Path("/proc/self/task").iterdir()))
    except OSError:
        return threading.active_count()

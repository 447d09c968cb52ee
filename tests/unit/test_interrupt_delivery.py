"""Ctrl-C that lands in a finalizer is not lost to "Exception ignored in": the program's
handler (:func:`audit.cli._stop`) delivers it again once the finalizer is done."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# An object whose finalizer is interrupted: it signals its own process, then runs on
# (a call, so the signal is handled inside __del__), as a collected Popen did once.
PROGRAM = textwrap.dedent(
    """
    import signal, time
    from audit import cli

    signal.signal(signal.SIGINT, cli._stop)
    finalized = []

    class Slow:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)
            for _ in range(3):
                time.sleep(0.001)
            finalized.append(True)

    try:
        Slow()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.001)
        print("never interrupted")
    except KeyboardInterrupt:
        print("interrupted after the finalizer:", finalized == [True])
    """
)


def run(program: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_interrupt_in_a_finalizer_is_delivered_after_it() -> None:
    done = run(PROGRAM)
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout.strip() == "interrupted after the finalizer: True"


# The same in a weak reference's callback, the code of _weakrefset.py as a WeakSet runs
# it when a member is collected (a CI run of tests/faults/test_interrupts.py met it:
# Ctrl-C while the reports were written).
WEAKREF_PROGRAM = textwrap.dedent(
    """
    import signal, time, weakref, _weakrefset
    from audit import cli

    signal.signal(signal.SIGINT, cli._stop)
    removed = []

    class Member:
        pass

    def callback(ref):
        signal.raise_signal(signal.SIGINT)
        for _ in range(3):
            time.sleep(0.001)
        removed.append(True)

    callback.__code__ = callback.__code__.replace(co_filename=_weakrefset.__file__)
    member = Member()
    watch = weakref.ref(member, callback)
    try:
        del member
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.001)
        print("never interrupted")
    except KeyboardInterrupt:
        print("interrupted after the callback:", removed == [True])
    """
)


def test_an_interrupt_in_a_weak_reference_s_callback_is_delivered_after_it() -> None:
    done = run(WEAKREF_PROGRAM)
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout.strip() == "interrupted after the callback: True"


def test_without_the_handler_python_swallows_it() -> None:
    """The failure this guards against, shown with Python's own handler."""
    done = run(PROGRAM.replace("signal.signal(signal.SIGINT, cli._stop)", ""))
    assert "Exception ignored" in done.stderr
    assert done.stdout.strip() == "never interrupted"


def test_an_interrupt_once_the_run_is_over_is_ignored() -> None:
    program = textwrap.dedent(
        """
        import signal
        from audit import cli

        cli.main = lambda argv=None: 0
        code = cli.entry()
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        print("exit", code)
        """
    )
    done = run(program)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "exit 0"
    assert done.stderr == ""

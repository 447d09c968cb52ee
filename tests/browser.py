"""A headless Chromium driven over the DevTools protocol, with nothing but the stdlib.

Chromium's ``--remote-debugging-pipe`` reads protocol messages on fd 3 and writes
on fd 4, each a JSON object ended by a NUL byte: no websocket library, no driver
binary. Enough of the protocol for the report tests: open a page, read what it
shows, click like a person (mouse events at an element's position), take a
screenshot, and collect script errors.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM_ENV = "FENCE_AUDIT_CHROMIUM"


def find_chromium() -> str | None:
    if env := os.environ.get(CHROMIUM_ENV):
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if found := shutil.which(name):
            return found
    return None


def _high(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


class Browser:
    def __init__(self, executable: str, width: int = 1280, height: int = 1000) -> None:
        self.profile = tempfile.mkdtemp(prefix="fence-audit-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # Out of the way of 3 and 4, which the shell below redirects onto.
        to_browser_r = _high(to_browser_r)
        from_browser_w = _high(from_browser_w)
        command = [
            executable,
            "--headless",
            "--no-sandbox",  # CI runs as root, where the sandbox refuses to start
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--remote-debugging-pipe",
            f"--user-data-dir={self.profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        # bash (dash takes single-digit fds only) puts the pipes on the fds the
        # protocol expects, then becomes chromium.
        self.process = subprocess.Popen(
            ["bash", "-c", f'exec "$@" 3<&{to_browser_r} 4>&{from_browser_w}', "bash", *command],
            pass_fds=(to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)

    # --- protocol ---------------------------------------------------------------

    def call(self, method: str, *, session: bool = False, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read(timeout=30)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self.events.append(reply)

    def _read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self._from_browser, 65536)
            if not chunk:
                raise RuntimeError("chromium closed the protocol pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    def wait_for(self, method: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event.get("method") == method:
                    self.events.remove(event)
                    return event
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} event")
            self.events.append(self._read(timeout=deadline - time.monotonic()))

    # --- what a test does -------------------------------------------------------

    def open(self, path: Path) -> None:
        self.call("Page.navigate", session=True, url=path.resolve().as_uri())
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def visible_text(self, selector: str = "body") -> str:
        text = self.evaluate(f"document.querySelector({json.dumps(selector)}).innerText")
        return str(text)

    def click(self, selector: str) -> None:
        """Scroll the element into view and click its centre with the mouse."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.left + Math.min(r.width / 2, 40), r.top + r.height / 2]; })()"
        )
        x, y = box
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent",
                session=True,
                type=kind,
                x=x,
                y=y,
                button="left",
                clickCount=1,
            )

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", session=True, format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def script_errors(self) -> list[str]:
        """Uncaught exceptions and console errors seen so far."""
        self.evaluate("0")  # let pending events arrive
        errors = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                errors.append(str(params["exceptionDetails"].get("text")))
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                errors.append(json.dumps(params.get("args")))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                errors.append(str(params["entry"].get("text")))
        return errors

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.call("Browser.close")
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        shutil.rmtree(self.profile, ignore_errors=True)

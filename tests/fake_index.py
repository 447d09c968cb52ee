"""A package index on loopback serving one fake vLLM sdist (PEP 691 JSON)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def make_sdist(version: str) -> bytes:
    """A tiny sdist: a tests/ package with one test, and a vllm/ folder that must stay out."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in {
            f"vllm-{version}/tests/__init__.py": "",
            f"vllm-{version}/tests/test_x.py": "def test_x():\n    assert True\n",
            f"vllm-{version}/vllm/__init__.py": "raise ImportError('sdist vllm must stay out')\n",
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class FakeIndex:
    """Serves ``vllm-VERSION.tar.gz``; ``digest`` is the sha256 it publishes for it."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.sdist = make_sdist(version)
        self.digest = hashlib.sha256(self.sdist).hexdigest()
        self.requests: list[str] = []
        self.answer: bytes | None = None  # the listing page's bytes, if not the listing
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                index.requests.append(self.path)
                if self.path == "/simple/vllm/":
                    body = index.answer or json.dumps(index.listing()).encode()
                elif self.path == "/files/vllm.tar.gz":
                    body = index.sdist
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = f"{self.base}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def listing(self) -> dict[str, object]:
        return {
            "meta": {"api-version": "1.1"},
            "files": [
                {
                    "filename": f"vllm-{self.version}.tar.gz",
                    "url": f"{self.base}/files/vllm.tar.gz",
                    "hashes": {"sha256": self.digest},
                }
            ],
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

"""A client's callback endpoint for the gateway's tests: a plain HTTP server (a thread of
the test process) that records every request it gets.

``/redirect...`` answers ``302`` to ``/elsewhere`` on the same server, ``/fail...``
answers ``500``; anything else ``200 OK``."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl


@dataclass(frozen=True)
class Hit:
    verb: str
    path: str
    content_type: str
    body: bytes

    @property
    def form(self) -> dict[str, str]:
        return dict(parse_qsl(self.body.decode()))

    def json(self) -> Any:
        return json.loads(self.body)


class Hooks:
    """The endpoint, on ``127.0.0.1:port`` (0: a free port)."""

    def __init__(self, port: int = 0) -> None:
        self.hits: list[Hit] = []
        self.changed = threading.Condition()
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                hit = Hit(
                    self.command,
                    self.path,
                    self.headers.get("Content-Type", ""),
                    self.rfile.read(size) if size else b"",
                )
                # Noted before the answer: a caller that has its answer finds its hit here.
                with hooks.changed:
                    hooks.hits.append(hit)
                    hooks.changed.notify_all()
                if self.path.startswith("/redirect"):
                    self.send_response(302)
                    self.send_header("Location", f"{hooks.url}/elsewhere")
                else:
                    self.send_response(500 if self.path.startswith("/fail") else 200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"OK")

            do_GET = do_POST

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Hit]:
        """The hits, once there are at least ``count`` (fails after ``timeout`` s)."""
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.hits) >= count, timeout), self.hits
            return list(self.hits)

    def at(self, path: str) -> list[Hit]:
        with self.changed:
            return [h for h in self.hits if h.path == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

"""The receiver as a WSGI application, and ``captcha-tasks pingback-server``.

The server is cheroot, CherryPy's production WSGI server: a thread pool, keep-alive,
and no request reaches the app before its headers are complete.  Any path ending in a
ticket is a callback, so the app works mounted under any prefix::

    GET  /<prefix>/<ticket>?id=<captcha id>&code=<answer>     (CaptchaAI)
    POST /<prefix>/<ticket>   id=<captcha id>&code=<answer>   (2captcha, form fields)

``GET /health`` answers ``ok`` (for health checks; never counted as a callback).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterable, Mapping
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl

from cheroot import wsgi

from .callbacks import MAX_BODY, Receiver, Verdict

log = logging.getLogger(__name__)

SERVER_THREADS = 32
StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def make_wsgi_app(receiver: Receiver) -> WSGIApp:
    """A WSGI app that hands every request to ``receiver``."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/health":  # for health checks: not a callback
            verdict = Verdict(200, "ok")
        else:
            verdict = judge(receiver, environ)
        body = verdict.reason.encode()
        status = f"{verdict.status} {HTTPStatus(verdict.status).phrase}"
        headers = [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))]
        start_response(status, headers)
        return [body]

    return app


def judge(receiver: Receiver, environ: Mapping[str, Any]) -> Verdict:
    """Read one WSGI request (its body only when small enough) and judge it."""
    raw = str(environ.get("CONTENT_LENGTH") or "0")
    size = int(raw) if raw.isdigit() else MAX_BODY + 1
    fields = dict(parse_qsl(str(environ.get("QUERY_STRING", "")), keep_blank_values=True))
    if 0 < size <= MAX_BODY:
        body = environ["wsgi.input"].read(size).decode("utf-8", errors="replace")
        fields.update(parse_qsl(body, keep_blank_values=True))
    segment = str(environ.get("PATH_INFO", "")).rstrip("/").rpartition("/")[2]
    address = str(environ.get("REMOTE_ADDR", ""))
    return receiver.handle_request(
        str(environ.get("REQUEST_METHOD", "")), segment, fields, address, size
    )


class PingbackServer:
    """The receiver on ``host:port`` (0 picks a free port), in a background thread."""

    def __init__(self, receiver: Receiver, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = wsgi.Server(
            (host, port),
            make_wsgi_app(receiver),
            numthreads=SERVER_THREADS,
            server_name="captcha-tasks-pingback",
        )
        self._server.prepare()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.bind_addr[1])

    def start(self) -> PingbackServer:
        self._thread = threading.Thread(target=self._server.serve, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.stop()
        if self._thread is not None:
            self._thread.join()


def serve(receiver: Receiver, host: str, port: int) -> None:
    """Serve callbacks in the foreground until Ctrl-C or SIGTERM."""
    server = PingbackServer(receiver, host, port).start()
    print(f"pingback receiver on http://{host}:{server.port}/<ticket>", flush=True)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        stopping.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()

"""The receiver as a WSGI application, for mounting it in a WSGI server or app.

``captcha-tasks pingback-server`` does not use it (see :mod:`.server`).  Any path ending
in a ticket is a callback, so the app works mounted under any prefix::

    GET  /<prefix>/<ticket>?id=<captcha id>&code=<answer>     (CaptchaAI)
    POST /<prefix>/<ticket>   id=<captcha id>&code=<answer>   (2captcha, form fields)
    POST /<prefix>/<ticket>   {"taskId": ..., "status": "ready", "solution": {...}}
                                                  (the JSON family: getTaskResult JSON)

``GET /health`` answers ``ok`` (for health checks; never counted as a callback).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from http import HTTPStatus
from typing import Any

from .callbacks import MAX_BODY, Receiver, Verdict, last_segment, request_fields

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
    body = environ["wsgi.input"].read(size) if 0 < size <= MAX_BODY else b""
    fields = request_fields(str(environ.get("QUERY_STRING", "")), body)
    address = receiver.client_address(
        str(environ.get("REMOTE_ADDR", "")), environ.get("HTTP_X_FORWARDED_FOR")
    )
    return receiver.handle_request(
        str(environ.get("REQUEST_METHOD", "")),
        last_segment(str(environ.get("PATH_INFO", ""))),
        fields,
        address,
        size,
        body,
    )

"""``captcha-tasks pingback-server``: the receiver served by the HTTP server core that every
process facing the internet shares (:mod:`captcha_tasks.serving.server`: deadlines, caps
per address and in total, the allowlist before a byte is read, trusted proxies).

The paths are the WSGI app's (:mod:`.wsgi`): any path ending in a ticket is a callback;
``/health`` is answered by the server core.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence

from ..serving import HttpServer, Limits, Request, Response, run
from .callbacks import MAX_BODY, Receiver, Verdict, last_segment, request_fields

#: Bytes of answers a provider may leave unread (ours are a few bytes each).
MAX_UNREAD = 64 * 1024


class PingbackSite:
    """The receiver as a :class:`~captcha_tasks.serving.Site`: each request is a callback
    for :meth:`.Receiver.handle_request`, answered with its verdict as plain text."""

    name = "pingback"
    max_body = MAX_BODY
    max_unread = MAX_UNREAD

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def allows(self, address: str) -> bool:
        return self.receiver.allows(address)

    def is_proxy(self, address: str) -> bool:
        return self.receiver.is_proxy(address)

    def client_address(self, peer: str, forwarded_for: Sequence[str]) -> str:
        return self.receiver.client_address(peer, forwarded_for)

    def respond(self, request: Request) -> Response:
        verdict = self.receiver.handle_request(
            request.method,
            last_segment(request.path),
            request_fields(request.query, request.body),
            request.address,
            request.body_size,
            request.body,
        )
        return _text(verdict)

    def refusal(self, status: int, reason: str) -> Response:
        return _text(Verdict(status, reason))


def _text(verdict: Verdict) -> Response:
    return Response.text(verdict.status, verdict.reason)


class PingbackServer(HttpServer):
    """The receiver on ``host:port`` (0 picks a free port); see
    :class:`~captcha_tasks.serving.HttpServer` for running it."""

    def __init__(
        self,
        receiver: Receiver,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: Limits | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(PingbackSite(receiver), host, port, limits, tls)
        self.receiver = receiver


def serve(receiver: Receiver, host: str, port: int, limits: Limits | None = None) -> None:
    """Serve callbacks in the foreground until Ctrl-C or SIGTERM."""
    run(PingbackServer(receiver, host, port, limits), "pingback receiver on {url}/<ticket>")

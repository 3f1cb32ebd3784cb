"""What a server of ours allows its clients, and whom it lets in: pure policy.

The pingback receiver and the gateway face the internet by design.  The server
(:mod:`.server`) asks :func:`admit` about every connection the moment it is accepted,
before a byte is read, and gives each request :attr:`Limits.header_timeout` for its
headers and :attr:`Limits.body_timeout` for its body, whatever pace the client keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum

from ..errors import ConfigurationError


@dataclass(frozen=True)
class Limits:
    """The server's limits.  The defaults hold a thousand slow connections with room left
    for the provider (or the clients that behave); ``captcha-tasks pingback-server --help``
    and ``captcha-tasks gateway --help`` name the options."""

    #: Seconds a client has to send a request's line and headers, counted from its
    #: connection (or from the previous response on a kept-alive one), however it drips.
    header_timeout: float = 10.0
    #: Seconds a client has to send a request's body once its headers are in.
    body_timeout: float = 10.0
    #: Open connections in all; when full, a new connection closes the one that has waited
    #: longest for its request (never one being answered).
    max_connections: int = 2048
    #: Open connections from one address (a trusted proxy's are not capped).
    max_per_address: int = 64
    #: Threads answering requests (the Redis calls and Celery publishes).
    judge_threads: int = 16
    #: Requests waiting for an answering thread; beyond them the answer is 503 at once.
    max_pending: int = 256
    #: Bytes of a request's line and headers (a GET request's fields are in its line).
    max_header_bytes: int = 16 * 1024
    #: Connections the kernel queues before the server accepts them.
    backlog: int = 1024

    def __post_init__(self) -> None:
        for spec in fields(self):
            if not getattr(self, spec.name) > 0:
                raise ConfigurationError(f"server limit {spec.name} must be > 0")


class Refusal(StrEnum):
    """Why a connection was closed at accept, unread."""

    NOT_ALLOWED = "not_allowed"  # outside the allowlist (CAPTCHAAI_PINGBACK_ALLOW, ...)
    PER_ADDRESS = "per_address"  # its address has max_per_address open already
    FULL = "full"  # max_connections open, every one of them being answered


@dataclass(frozen=True)
class Admit:
    """Let the connection in; first close the connection waiting longest for its request
    when ``evict`` (the server is full)."""

    evict: bool = False


def admit(
    limits: Limits,
    *,
    allowed: bool,
    proxy: bool,
    from_address: int,
    total: int,
    evictable: int,
) -> Admit | Refusal:
    """Whether a new connection comes in.  ``allowed``: its address passes the allowlist;
    ``proxy``: it is a trusted proxy (whose clients are judged once their headers say who
    they are); ``from_address`` / ``total``: connections open from its address / in all;
    ``evictable``: open ones waiting for a request."""
    if not (allowed or proxy):
        return Refusal.NOT_ALLOWED
    if not proxy and from_address >= limits.max_per_address:
        return Refusal.PER_ADDRESS
    if total >= limits.max_connections:
        # a slow client waits longest; a genuine callback is judged within milliseconds
        return Admit(evict=True) if evictable else Refusal.FULL
    return Admit()

"""Pingback URLs: where the provider calls back when a captcha is done.

Every submit sends ``pingback=<base>/<ticket>``, where the ticket names the solve and its
attempt and carries an HMAC of both under ``CAPTCHAAI_PINGBACK_SECRET``::

    https://hooks.example.com/captcha/3f2c...e1.0.9b4d...77

A leaked URL therefore speaks for one attempt of one solve only: the receiver
(:mod:`captcha_tasks.receiver`) accepts a callback when the ticket's MAC is right *and* the
callback's captcha id is the one that attempt has at the provider.

Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

from .errors import BadMac, BadTicket

#: Hex digits of the MAC in a ticket (128 bits).
MAC_HEX = 32
_SOLVE_ID = re.compile(r"[A-Za-z0-9_\-]{1,100}")


__all__ = ["BadMac", "BadTicket", "Ticket", "callback_url", "read_ticket", "ticket"]


@dataclass(frozen=True)
class Ticket:
    """One attempt of one solve, as a callback URL names it."""

    solve_id: str
    attempt: int


def _mac(secret: str, solve_id: str, attempt: int) -> str:
    message = f"{solve_id}.{attempt}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()[:MAC_HEX]


def ticket(secret: str, solve_id: str, attempt: int) -> str:
    """The last path segment of the callback URL of one attempt."""
    if not _SOLVE_ID.fullmatch(solve_id):
        raise ValueError("a solve id is letters, digits, '-' or '_'")
    return f"{solve_id}.{attempt}.{_mac(secret, solve_id, attempt)}"


def callback_url(base: str, secret: str, solve_id: str, attempt: int) -> str:
    """``<base>/<ticket>``: the ``pingback`` of one attempt's ``in.php`` call."""
    return f"{base.rstrip('/')}/{ticket(secret, solve_id, attempt)}"


def read_ticket(secret: str, segment: str) -> Ticket:
    """The attempt a callback path segment names; :class:`BadTicket` unless its MAC is
    right (compared in constant time)."""
    solve_id, _, rest = segment.partition(".")
    attempt, _, mac = rest.partition(".")
    counted = attempt.isascii() and attempt.isdigit() and len(attempt) <= 6
    if not (_SOLVE_ID.fullmatch(solve_id) and counted and len(mac) == MAC_HEX):
        raise BadTicket("the callback path is not a pingback ticket")
    if not hmac.compare_digest(mac, _mac(secret, solve_id, int(attempt))):
        raise BadMac("the callback's MAC is wrong")
    return Ticket(solve_id, int(attempt))

"""Pingback URLs: where the provider calls back when a captcha is done.

Every submit sends ``pingback=<base>/<ticket>``, where the ticket names the solve, its
attempt and (for any provider but the primary) the provider it went to, and carries an
HMAC of them under ``CAPTCHAAI_PINGBACK_SECRET``::

    https://hooks.example.com/captcha/3f2c...e1.0.9b4d...77
    https://hooks.example.com/captcha/3f2c...e1.0.backup.51ce...02

A leaked URL therefore speaks for one attempt of one solve at one provider only: the
receiver
(:mod:`captcha_tasks.receiver`) accepts a callback when the ticket's MAC is right *and* the
callback's captcha id is the one that attempt has at the provider.

The JSON family (Anti-Captcha, CapSolver, CapMonster Cloud) gets the same URL as its
``callbackUrl`` and POSTs the task's ``getTaskResult`` JSON there, with its ``taskId``:
:func:`read_json_callback` reads such a body (the captcha id is its ``taskId``).

Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass

from ..errors import BadMac, BadTicket

#: Hex digits of the MAC in a ticket (128 bits).
MAC_HEX = 32
_SOLVE_ID = re.compile(r"[A-Za-z0-9_\-]{1,100}")
_PROVIDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]{0,31}")


__all__ = [
    "BadMac",
    "BadTicket",
    "JsonCallback",
    "NotACallback",
    "Ticket",
    "callback_url",
    "read_json_callback",
    "read_ticket",
    "ticket",
]

#: Characters of a JSON callback's ``taskId`` (an integer, or CapSolver's uuid).
MAX_TASK_ID = 100


@dataclass(frozen=True)
class Ticket:
    """One attempt of one solve, as a callback URL names it; ``provider`` None: the
    primary."""

    solve_id: str
    attempt: int
    provider: str | None = None


def _mac(secret: str, solve_id: str, attempt: int, provider: str | None) -> str:
    named = f"{solve_id}.{attempt}" if provider is None else f"{solve_id}.{attempt}.{provider}"
    return hmac.new(secret.encode(), named.encode(), hashlib.sha256).hexdigest()[:MAC_HEX]


def ticket(secret: str, solve_id: str, attempt: int, provider: str | None = None) -> str:
    """The last path segment of the callback URL of one attempt (at ``provider``; None:
    the primary)."""
    if not _SOLVE_ID.fullmatch(solve_id):
        raise ValueError("a solve id is letters, digits, '-' or '_'")
    if provider is not None and not _PROVIDER.fullmatch(provider):
        raise ValueError("a provider's name is letters, digits, '-' or '_'")
    middle = f"{attempt}" if provider is None else f"{attempt}.{provider}"
    return f"{solve_id}.{middle}.{_mac(secret, solve_id, attempt, provider)}"


def callback_url(
    base: str, secret: str, solve_id: str, attempt: int, provider: str | None = None
) -> str:
    """``<base>/<ticket>``: the ``pingback`` of one attempt's ``in.php`` call."""
    return f"{base.rstrip('/')}/{ticket(secret, solve_id, attempt, provider)}"


def read_ticket(secret: str, segment: str) -> Ticket:
    """The attempt a callback path segment names; :class:`BadTicket` unless its MAC is
    right (compared in constant time)."""
    parts = segment.split(".")
    if len(parts) == 3:
        (solve_id, attempt, mac), provider = parts, None
    elif len(parts) == 4 and _PROVIDER.fullmatch(parts[2]):
        solve_id, attempt, provider, mac = parts
    else:
        raise BadTicket("the callback path is not a pingback ticket")
    counted = attempt.isascii() and attempt.isdigit() and len(attempt) <= 6
    if not (_SOLVE_ID.fullmatch(solve_id) and counted and len(mac) == MAC_HEX):
        raise BadTicket("the callback path is not a pingback ticket")
    if not hmac.compare_digest(mac, _mac(secret, solve_id, int(attempt), provider)):
        raise BadMac("the callback's MAC is wrong")
    return Ticket(solve_id, int(attempt), provider)


@dataclass(frozen=True)
class JsonCallback:
    """A JSON-family callback body: the captcha it names (its ``taskId``, as text) and the
    body itself, re-encoded compactly (the ``getTaskResult`` reply its answer is read
    from)."""

    captcha_id: str
    body: str


@dataclass(frozen=True)
class NotACallback:
    """Why a body is no JSON-family callback: ``"not_json"`` (not a JSON object) or
    ``"missing_field"`` (no usable ``taskId``)."""

    reason: str


def read_json_callback(body: bytes) -> JsonCallback | NotACallback:
    """The callback a JSON provider POSTed (``body``: its bytes, already capped)."""
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return NotACallback("not_json")
    if not isinstance(data, dict):
        return NotACallback("not_json")
    task_id = data.get("taskId")
    if isinstance(task_id, bool) or not isinstance(task_id, int | str):
        return NotACallback("missing_field")
    captcha_id = str(task_id).strip()
    if not captcha_id or len(captcha_id) > MAX_TASK_ID:
        return NotACallback("missing_field")
    return JsonCallback(captcha_id, json.dumps(data, separators=(",", ":")))

"""A shared proxy pool with per-owner affinity and quarantine: the part the pipeline uses.

An *owner* (a worker, a login session) keeps the same proxy while it is alive, because
sites bind sessions to an IP.  Each assignment is two keys with their OWN TTL:
``proxy_assignment(owner) -> proxy`` and ``proxy_owner(proxy_id) -> owner``; refreshing
one owner never keeps another alive, and one expiry frees exactly one proxy.

Proxies the API reported bad (``ERROR_PROXY_CONNECTION_FAILED``, ``ERROR_BAD_PROXY``)
are quarantined: a sorted set scored by the Redis-clock time (ms) they come back.

Proxy strings are ``[type://][user:password@]host:port`` (type ``http`` (default),
``https``, ``socks4``, ``socks5``).  The pool stores them canonically (type lower-case,
``http://`` omitted); key names use a short hash, and logs, reprs and errors show them
masked (``user:***@host:port``) only.

A solve with ``proxy="pool"`` acquires, releases and replaces through :class:`ProxyLeases`;
the whole pool for your own code (listing, removing, renewing) is
:class:`captcha_tasks.toolkit.proxies.ProxyPool`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any, TypeVar

from ..core.proxyspec import PROXY_TYPES, Proxy, mask, parse, proxy_id, split
from .db import Db
from .lua import Script, text

__all__ = ["PROXY_TYPES", "ProxyLeases", "mask", "proxy_id", "split"]

T = TypeVar("T")

log = logging.getLogger(__name__)

#: Free-looking proxies offered to one call of ``proxies/acquire`` (its 12 keys' share).
CANDIDATES = 8
#: Reads of the owner's assignment before giving up on a race with another acquire.
ACQUIRE_TRIES = 3

ACQUIRE = Script("proxies/acquire")

RELEASE = Script("proxies/release")

QUARANTINE = Script("proxies/quarantine")


def _owner(owner: str) -> str:
    if not isinstance(owner, str) or not owner or len(owner) > 200:
        raise ValueError("owner must be a non-empty str of at most 200 characters")
    if any(ch.isspace() for ch in owner):
        raise ValueError("owner must not contain whitespace")
    return owner


def _ms(seconds: float, what: str) -> int:
    if not isinstance(seconds, int | float) or seconds <= 0:
        raise ValueError(f"{what} must be a positive number of seconds")
    return max(1, round(seconds * 1000))


# -- leases ---------------------------------------------------------------------------
class ProxyLeases:
    """Proxies shared by many workers: sticky per owner, each assignment with its own TTL."""

    mask = staticmethod(mask)
    split = staticmethod(split)

    def __init__(self, db: Db, assignment_ttl_s: float = 600, quarantine_s: float = 300) -> None:
        self._ttl_ms = _ms(assignment_ttl_s, "assignment_ttl_s")
        self._cool_ms = _ms(quarantine_s, "quarantine_s")
        self._db = db
        self._r = db.redis
        self._keys = db.keys
        self._acquire = db.bind(ACQUIRE)
        self._release = db.bind(RELEASE)
        self._quarantine = db.bind(QUARANTINE)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(prefix={self._keys.prefix!r}, "
            f"assignment_ttl_s={self._ttl_ms / 1000:g}, quarantine_s={self._cool_ms / 1000:g})"
        )

    def _guarded(self, call: Callable[[], T]) -> T:
        return self._db.guard(call, "the proxy pool is unavailable")

    def _owner_key(self, proxy: str) -> str:
        return self._keys.proxy_owner(proxy_id(proxy))

    # -- membership -----------------------------------------------------------------
    def add(self, *proxies: str) -> int:
        """Add proxies (all validated first); returns how many were new."""
        parsed = []
        for index, proxy in enumerate(proxies):
            try:
                parsed.append(parse(proxy).canonical)
            except ValueError as exc:
                raise ValueError(f"proxy #{index}: {exc}") from None
        if not parsed:
            return 0
        return int(self._guarded(lambda: self._r.sadd(self._keys.proxies(), *parsed)))

    # -- assignments ----------------------------------------------------------------
    def current(self, owner: str) -> str | None:
        """The proxy assigned to ``owner`` right now, without refreshing it."""
        key = self._keys.proxy_assignment(_owner(owner))
        value = self._guarded(lambda: self._r.get(key))
        return None if value is None else text(value)

    def acquire(self, owner: str) -> str | None:
        """The owner's live proxy (its TTL refreshed), else a free one, else None."""
        return self._acquire_for(_owner(owner))

    def _acquire_for(self, owner: str) -> str | None:
        for _ in range(ACQUIRE_TRIES):
            found = self._try_acquire(owner)
            if found != "again":
                return found
        return None  # the owner's assignment kept changing under us: another acquire won

    def _try_acquire(self, owner: str) -> str | None:
        """The owner's live proxy or a free one (None: none), or ``"again"`` when the
        owner's assignment changed since it was read."""
        k, r = self._keys, self._r
        pipe = r.pipeline(transaction=False)
        pipe.get(k.proxy_assignment(owner))
        pipe.smembers(k.proxies())
        current, members = self._guarded(pipe.execute)
        current = None if current is None else text(current)
        pool = [text(p) for p in members]
        random.shuffle(pool)  # spread owners over the pool instead of piling on one
        if len(pool) > CANDIDATES:
            held = self._guarded(lambda: r.mget([self._owner_key(p) for p in pool]))
            pool = [p for p, holder in zip(pool, held, strict=True) if holder is None]
        keys: dict[str, Any] = {
            "proxies": k.proxies(),
            "quarantine": k.proxy_quarantine(),
            "assignment": k.proxy_assignment(owner),
            "current_owner": self._owner_key(current) if current else k.proxy_owner("-"),
        }
        args: dict[str, Any] = {"ttl_ms": self._ttl_ms, "owner": owner}
        if current:
            args["current"] = current
        for start in range(0, max(1, len(pool)), CANDIDATES):
            reply = self._offer(keys, args, pool[start : start + CANDIDATES])
            if reply == "again":
                return "again"
            if reply:
                return text(reply[0])
            args.pop("current", None)  # dead: the first call dropped it
            keys["current_owner"] = k.proxy_owner("-")
        return None

    def _offer(self, keys: dict[str, Any], args: dict[str, Any], chunk: list[str]) -> Any:
        """One call of ``proxies/acquire`` with these candidates."""
        keys = {**keys, "owners": [self._owner_key(p) for p in chunk]}
        args = {**args, "candidates": chunk}
        return self._guarded(lambda: self._acquire(keys, args))

    def release(self, owner: str) -> bool:
        """Free the owner's proxy; False (and nothing freed) if it is not the owner's."""
        owner = _owner(owner)
        proxy = self.current(owner)
        if proxy is None:
            return False
        keys = {"assignment": self._keys.proxy_assignment(owner), "owner": self._owner_key(proxy)}
        args = {"owner": owner, "proxy": proxy}
        return bool(self._guarded(lambda: self._release(keys, args)))

    # -- bad proxies ----------------------------------------------------------------
    def quarantine(self, proxy: str, cool_off_s: float | None = None) -> None:
        """Exclude a proxy for ``cool_off_s`` and drop its assignment; it returns after."""
        parsed = parse(proxy)
        cool_ms = self._cool_ms if cool_off_s is None else _ms(cool_off_s, "cool_off_s")
        self._quarantine_parsed(parsed, cool_ms)

    def _quarantine_parsed(self, parsed: Proxy, cool_ms: int) -> None:
        owner_key = self._owner_key(parsed.canonical)
        holder = self._guarded(lambda: self._r.get(owner_key))
        keys = {
            "quarantine": self._keys.proxy_quarantine(),
            "owner": owner_key,
            # nobody held it: the key of a blank owner, which no owner can be
            "assignment": self._keys.proxy_assignment(text(holder) if holder else " "),
        }
        args = {"proxy": parsed.canonical, "cool_ms": cool_ms}
        self._guarded(lambda: self._quarantine(keys, args))
        log.warning("proxy %s quarantined for %.1fs", parsed.masked, cool_ms / 1000)

    def replace(self, owner: str, cool_off_s: float | None = None) -> str | None:
        """Quarantine the owner's proxy (it failed) and acquire another for the owner."""
        owner = _owner(owner)
        cool_ms = self._cool_ms if cool_off_s is None else _ms(cool_off_s, "cool_off_s")
        failed = self.current(owner)
        if failed is not None:
            self._quarantine_parsed(parse(failed), cool_ms)
        return self._acquire_for(owner)

"""A shared proxy pool with per-owner affinity and quarantine.

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
"""

from __future__ import annotations

import logging
import random

import redis

from ..keys import Keys
from ..proxyspec import PROXY_TYPES, Proxy, mask, parse, proxy_id, split
from .lua import lua, script, text

__all__ = ["PROXY_TYPES", "ProxyPool", "mask", "proxy_id", "split"]

log = logging.getLogger(__name__)


ACQUIRE_LUA = lua(
    """
-- KEYS[1] = the pool's proxy set
-- KEYS[2] = the quarantine sorted set (score = when the proxy comes back, ms, Redis clock)
-- KEYS[3] = the owner's assignment key
-- KEYS[3+i] = the owner key of candidate ARGV[2+i]
-- ARGV[1] = assignment TTL (ms)
-- ARGV[2] = owner
-- ARGV[2+i] = candidate proxies (the pool's members, shuffled by the caller)
-- returns {proxy, 1} when the owner keeps its live assignment (both its keys refreshed),
--   {proxy, 0} for a new assignment, false when no proxy is free
""",
    """
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local ttl, owner = ARGV[1], ARGV[2]
local function usable(proxy)
  return redis.call('SISMEMBER', KEYS[1], proxy) == 1
    and not redis.call('ZSCORE', KEYS[2], proxy)
end
local current = redis.call('GET', KEYS[3])
if current then
  for i = 3, #ARGV do
    if ARGV[i] == current then
      local held = redis.call('GET', KEYS[i + 1]) == owner
      if held and usable(current) then
        redis.call('PEXPIRE', KEYS[3], ttl)
        redis.call('PEXPIRE', KEYS[i + 1], ttl)
        return {current, 1}
      end
      if held then redis.call('DEL', KEYS[i + 1]) end
      break
    end
  end
  -- removed, quarantined or taken over: this assignment is dead
  redis.call('DEL', KEYS[3])
end
for i = 3, #ARGV do
  local proxy = ARGV[i]
  if redis.call('EXISTS', KEYS[i + 1]) == 0 and usable(proxy) then
    redis.call('SET', KEYS[i + 1], owner, 'PX', ttl)
    redis.call('SET', KEYS[3], proxy, 'PX', ttl)
    return {proxy, 0}
  end
end
return false
""",
)

RELEASE_LUA = """
-- KEYS[1] = the owner's assignment key
-- KEYS[2] = the owner key of the proxy the assignment named
-- ARGV[1] = owner
-- ARGV[2] = that proxy
-- returns 1 if the proxy was freed, 0 if it is not (or no longer) held by this owner
if redis.call('GET', KEYS[1]) == ARGV[2] then
  redis.call('DEL', KEYS[1])
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  return 1
end
return 0
"""

RENEW_LUA = """
-- KEYS[1] = the owner's assignment key
-- KEYS[2] = the owner key of the proxy the assignment named
-- ARGV[1] = owner
-- ARGV[2] = that proxy
-- ARGV[3] = assignment TTL (ms)
-- returns 1 if both keys still name each other and their TTLs were reset, else 0
if redis.call('GET', KEYS[1]) == ARGV[2] and redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return 1
end
return 0
"""

QUARANTINE_LUA = lua(
    """
-- KEYS[1] = the quarantine sorted set
-- KEYS[2] = the proxy's owner key
-- KEYS[3] = (optional) the assignment key of the owner that held the proxy when read
-- ARGV[1] = proxy
-- ARGV[2] = cool-off (ms)
-- returns when the proxy comes back (ms, Redis clock)
""",
    """
local back = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], back, ARGV[1])
redis.call('DEL', KEYS[2])
if KEYS[3] and redis.call('GET', KEYS[3]) == ARGV[1] then
  redis.call('DEL', KEYS[3])
end
return back
""",
)

QUARANTINED_LUA = lua(
    """
-- KEYS[1] = the quarantine sorted set
-- ARGV (none)
-- returns the proxies still cooling off (expired entries are dropped)
""",
    """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
""",
)


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


# -- pool -----------------------------------------------------------------------------
class ProxyPool:
    """Proxies shared by many workers: sticky per owner, each assignment with its own TTL."""

    mask = staticmethod(mask)
    split = staticmethod(split)

    def __init__(
        self, r: redis.Redis, keys: Keys, assignment_ttl_s: float = 600, quarantine_s: float = 300
    ) -> None:
        self._ttl_ms = _ms(assignment_ttl_s, "assignment_ttl_s")
        self._cool_ms = _ms(quarantine_s, "quarantine_s")
        self._r = r
        self._keys = keys
        self._acquire = script(r, ACQUIRE_LUA)
        self._release = script(r, RELEASE_LUA)
        self._renew = script(r, RENEW_LUA)
        self._quarantine = script(r, QUARANTINE_LUA)
        self._quarantined = script(r, QUARANTINED_LUA)

    def __repr__(self) -> str:
        return (
            f"ProxyPool(prefix={self._keys.prefix!r}, assignment_ttl_s={self._ttl_ms / 1000:g}, "
            f"quarantine_s={self._cool_ms / 1000:g})"
        )

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
        return int(self._r.sadd(self._keys.proxies(), *parsed))

    def remove(self, proxy: str) -> bool:
        """Take a proxy out of the pool; its holder loses it at its next acquire."""
        canonical = parse(proxy).canonical
        with self._r.pipeline(transaction=True) as pipe:
            pipe.srem(self._keys.proxies(), canonical)
            pipe.zrem(self._keys.proxy_quarantine(), canonical)
            pipe.delete(self._owner_key(canonical))
            removed = pipe.execute()[0]
        return bool(removed)

    def all(self) -> list[str]:
        """Every proxy in the pool (with credentials: do not log them, use :func:`mask`)."""
        return sorted(text(p) for p in self._r.smembers(self._keys.proxies()))

    # -- assignments ----------------------------------------------------------------
    def current(self, owner: str) -> str | None:
        """The proxy assigned to ``owner`` right now, without refreshing it."""
        value = self._r.get(self._keys.proxy_assignment(_owner(owner)))
        return None if value is None else text(value)

    def acquire(self, owner: str) -> str | None:
        """The owner's live proxy (its TTL refreshed), else a free one, else None."""
        return self._acquire_for(_owner(owner))

    def _acquire_for(self, owner: str) -> str | None:
        members = [text(p) for p in self._r.smembers(self._keys.proxies())]
        random.shuffle(members)  # spread owners over the pool instead of piling on one
        keys = [self._keys.proxies(), self._keys.proxy_quarantine()]
        keys.append(self._keys.proxy_assignment(owner))
        keys.extend(self._owner_key(p) for p in members)
        reply = self._acquire(keys=keys, args=[self._ttl_ms, owner, *members])
        return None if not reply else text(reply[0])

    def release(self, owner: str) -> bool:
        """Free the owner's proxy; False (and nothing freed) if it is not the owner's."""
        owner = _owner(owner)
        proxy = self.current(owner)
        if proxy is None:
            return False
        keys = [self._keys.proxy_assignment(owner), self._owner_key(proxy)]
        return bool(self._release(keys=keys, args=[owner, proxy]))

    def renew(self, owner: str) -> bool:
        """Reset the TTL of the owner's assignment only; False if it has none."""
        owner = _owner(owner)
        proxy = self.current(owner)
        if proxy is None:
            return False
        keys = [self._keys.proxy_assignment(owner), self._owner_key(proxy)]
        return bool(self._renew(keys=keys, args=[owner, proxy, self._ttl_ms]))

    # -- bad proxies ----------------------------------------------------------------
    def quarantine(self, proxy: str, cool_off_s: float | None = None) -> None:
        """Exclude a proxy for ``cool_off_s`` and drop its assignment; it returns after."""
        parsed = parse(proxy)
        cool_ms = self._cool_ms if cool_off_s is None else _ms(cool_off_s, "cool_off_s")
        self._quarantine_parsed(parsed, cool_ms)

    def _quarantine_parsed(self, parsed: Proxy, cool_ms: int) -> None:
        owner_key = self._owner_key(parsed.canonical)
        keys = [self._keys.proxy_quarantine(), owner_key]
        holder = self._r.get(owner_key)
        if holder is not None:
            keys.append(self._keys.proxy_assignment(text(holder)))
        self._quarantine(keys=keys, args=[parsed.canonical, cool_ms])
        log.warning("proxy %s quarantined for %.1fs", parsed.masked, cool_ms / 1000)

    def quarantined(self) -> list[str]:
        """Proxies currently cooling off."""
        reply = self._quarantined(keys=[self._keys.proxy_quarantine()])
        return sorted(text(p) for p in reply)

    def replace(self, owner: str, cool_off_s: float | None = None) -> str | None:
        """Quarantine the owner's proxy (it failed) and acquire another for the owner."""
        owner = _owner(owner)
        cool_ms = self._cool_ms if cool_off_s is None else _ms(cool_off_s, "cool_off_s")
        failed = self.current(owner)
        if failed is not None:
            self._quarantine_parsed(parse(failed), cool_ms)
        return self._acquire_for(owner)

"""Shared login sessions: one domain's cookies in Redis, a lock, and "log in once".

Many workers on many hosts scrape the same site.  They share one set of cookies per
domain (:class:`CookieStore`) so that a stale session costs ONE login (and one captcha)
instead of one per worker: :func:`reauthenticate` / :func:`try_reauthenticate` let the
worker that takes the domain's :class:`SessionLock` log in while the others wait for the
session version to change and then re-read the cookies.

What is deliberately NOT shared here:

* CSRF tokens.  They are bound to one page load / session and must be read fresh from
  the page before each form submit; a shared one is wrong as soon as anybody reloads.
* Browser signals (user agent, viewport, locale).  They are configuration that every
  worker applies identically, not runtime state; keep them in settings.

Cookie values are secrets: nothing here logs them, and :class:`Cookies` (what every read
returns) masks them in its repr.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from http.cookiejar import CookieJar
from types import TracebackType
from typing import Any

import redis
from requests.cookies import RequestsCookieJar

from ..errors import ReauthTimeout, SessionBusy, SessionError
from ..settings import Settings
from ..state.connections import redis_client
from ..state.keys import Keys
from ..state.lua import Script, text

__all__ = [
    "Cookies",
    "CookieStore",
    "LockFactory",
    "ReauthResult",
    "ReauthStatus",
    "ReauthTimeout",
    "SessionBusy",
    "SessionError",
    "SessionLock",
    "domain_matches",
    "from_playwright",
    "from_requests",
    "reauthenticate",
    "to_playwright",
    "to_requests",
    "try_reauthenticate",
]

log = logging.getLogger(__name__)

#: One script each, for any client of the same Redis to run too (see :mod:`..state.lua`).
SAVE_COOKIES = Script("sessions/save_cookies")
LOCK_ACQUIRE = Script("sessions/lock_acquire")
LOCK_EXTEND = Script("sessions/lock_extend")
LOCK_RELEASE = Script("sessions/lock_release")

#: A session lock's default TTL: short, because its holder keeps it alive while it works
#: (:class:`SessionLock` used as a context manager, and every login of
#: :func:`reauthenticate`, extend it every third of it), so that a holder that died (a
#: SIGKILL, a lost host) holds up the others for at most this long.
LOCK_TTL_MS = 3000

_DOMAIN_RE = re.compile(r"^[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?$")


# -- values ---------------------------------------------------------------------------
class Cookies(dict[str, str]):
    """Cookie name -> value, plus the store ``version`` they were read at.

    A plain dict in every other way (JSON, pickling, equality); only the repr differs:
    it shows names and masks the values, so logging one is safe.
    """

    version: int

    def __init__(self, items: Mapping[str, str] | None = None, version: int = 0) -> None:
        super().__init__(items or {})
        self.version = version

    def __repr__(self) -> str:
        names = ", ".join(f"{name!r}: '***'" for name in self)
        return f"Cookies({{{names}}}, version={self.version})"

    __str__ = __repr__


class ReauthStatus(StrEnum):
    COOKIES = "cookies"  # fresh cookies are in the result
    WAIT = "wait"  # another worker is logging in: call again after retry_after_s


@dataclass(frozen=True)
class ReauthResult:
    """What :func:`try_reauthenticate` found; "not ready" is ``status == WAIT``."""

    status: ReauthStatus
    cookies: Cookies
    retry_after_s: float = 0.0
    logged_in: bool = False  # True when THIS call ran login()

    @property
    def ready(self) -> bool:
        return self.status is ReauthStatus.COOKIES

    @property
    def version(self) -> int:
        return self.cookies.version


# -- helpers --------------------------------------------------------------------------


def _normal_domain(domain: str) -> str:
    """Lower-case host name without a leading dot; it becomes part of key names."""
    if not isinstance(domain, str):
        raise TypeError("domain must be a str")
    host = domain.strip().lower().lstrip(".")
    if not host or len(host) > 253 or not _DOMAIN_RE.match(host):
        raise ValueError(f"invalid domain {domain[:80]!r}: expected a host name")
    return host


def _ms(seconds: float, what: str) -> int:
    if not isinstance(seconds, int | float) or seconds <= 0:
        raise ValueError(f"{what} must be a positive number of seconds")
    return max(1, round(seconds * 1000))


def _checked_cookies(cookies: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``cookies``; errors name the cookie, never its value."""
    if not isinstance(cookies, Mapping):
        raise TypeError("cookies must be a mapping of name -> value")
    if not cookies:
        raise ValueError("no cookies to save (use clear() to drop a session)")
    clean: dict[str, str] = {}
    for name, value in cookies.items():
        if not isinstance(name, str) or not name:
            raise ValueError("cookie names must be non-empty strings")
        if not isinstance(value, str):
            raise TypeError(f"cookie {name!r}: value must be str, not {type(value).__name__}")
        clean[name] = value
    return clean


def domain_matches(cookie_domain: str, domain: str) -> bool:
    """Whether a browser would send a cookie of ``cookie_domain`` to host ``domain``.

    ``.example.com`` (a domain cookie) matches ``example.com`` and its subdomains; a
    host-only ``example.com`` matches exactly.  A leading dot on ``domain`` is ignored.
    """
    cookie_host = cookie_domain.strip().lower()
    host = domain.strip().lower().lstrip(".")
    if not cookie_host or not host:
        return False
    if cookie_host.startswith("."):
        base = cookie_host[1:]
        return host == base or host.endswith("." + base)
    return cookie_host == host


# -- cookie store ---------------------------------------------------------------------
class CookieStore:
    """One domain's cookies in a Redis hash with a TTL, plus a version counter.

    Every :meth:`save` bumps the version, so a worker that remembers the version its
    cookies came from can tell "somebody already logged in again" from "still stale".
    The version key has no TTL: it must outlive the cookies to keep that comparison valid.
    """

    def __init__(self, r: redis.Redis, keys: Keys, ttl_s: float = 3600) -> None:
        self._ttl_ms = _ms(ttl_s, "ttl_s")
        self.redis = r
        self.keys = keys
        self._save = SAVE_COOKIES.bind(r)

    def __repr__(self) -> str:
        return f"CookieStore(prefix={self.keys.prefix!r}, ttl_s={self._ttl_ms / 1000:g})"

    @classmethod
    def from_settings(cls, settings: Settings | None = None, ttl_s: float = 3600) -> CookieStore:
        """The deployment's cookie store: ``REDIS_URL`` and ``CAPTCHAAI_KEY_PREFIX`` of
        ``settings`` (default: the package app's, ``app.settings()`` at this call: those
        ``app.use`` gave, else the environment's)."""
        if settings is None:
            from ..worker.app import app

            settings = app.settings()
        return cls(redis_client(settings), Keys(settings.redis.key_prefix), ttl_s)

    def save(self, domain: str, cookies: Mapping[str, str], ttl_s: float | None = None) -> int:
        """Replace the domain's cookies atomically; returns the new version."""
        host = _normal_domain(domain)
        ttl_ms = self._ttl_ms if ttl_s is None else _ms(ttl_s, "ttl_s")
        return self._replace(host, _checked_cookies(cookies), ttl_ms)

    def _replace(self, host: str, cookies: dict[str, str], ttl_ms: int) -> int:
        # One script: a reader sees the old hash or the new one, never a mix or a gap.
        keys = {"cookies": self.keys.cookies(host), "version": self.keys.session_version(host)}
        return int(self._save(keys, {"cookies": cookies, "ttl_ms": ttl_ms}))

    def load(self, domain: str) -> Cookies:
        """The domain's cookies (empty when none or expired), tagged with their version."""
        host = _normal_domain(domain)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.keys.cookies(host))
            pipe.get(self.keys.session_version(host))
            raw, version = pipe.execute()
        cookies = {text(k): text(v) for k, v in raw.items()}
        return Cookies(cookies, version=int(version or 0))

    def version(self, domain: str) -> int:
        """How many times the domain's cookies were saved (0 = never)."""
        return int(self.redis.get(self.keys.session_version(_normal_domain(domain))) or 0)

    def ttl_s(self, domain: str) -> float | None:
        """Seconds the cookies have left, or None when there are none."""
        left = int(self.redis.pttl(self.keys.cookies(_normal_domain(domain))))
        return left / 1000 if left >= 0 else None

    def clear(self, domain: str) -> None:
        """Drop the cookies.  The version is kept: nobody produced a newer session."""
        self.redis.delete(self.keys.cookies(_normal_domain(domain)))


# -- adapters -------------------------------------------------------------------------
def to_requests(
    cookies: Mapping[str, str], jar: RequestsCookieJar, domain: str, path: str = "/"
) -> RequestsCookieJar:
    """Put ``cookies`` into a requests jar (e.g. ``session.cookies``) for ``domain``."""
    for name, value in _checked_cookies(cookies).items():
        jar.set(name, value, domain=domain, path=path)
    return jar


def from_requests(jar: CookieJar, domain: str) -> Cookies:
    """The jar's cookies that a browser would send to ``domain`` (later ones win)."""
    return Cookies(
        {c.name: c.value for c in jar if c.value is not None and domain_matches(c.domain, domain)}
    )


def to_playwright(cookies: Mapping[str, str], domain: str, path: str = "/") -> list[dict[str, Any]]:
    """Cookies in ``BrowserContext.add_cookies()`` format (name, value, domain, path)."""
    return [
        {"name": name, "value": value, "domain": domain, "path": path}
        for name, value in _checked_cookies(cookies).items()
    ]


def from_playwright(cookies: Iterable[Mapping[str, Any]], domain: str) -> Cookies:
    """The ``BrowserContext.cookies()`` entries that belong to ``domain``."""
    kept: dict[str, str] = {}
    for index, cookie in enumerate(cookies):
        name, value = cookie.get("name"), cookie.get("value")
        if not isinstance(name, str) or not isinstance(value, str):
            raise ValueError(f"cookie #{index} has no string name/value")
        if domain_matches(str(cookie.get("domain", "")), domain):
            kept[name] = value
    return Cookies(kept)


# -- lock -----------------------------------------------------------------------------
class SessionLock:
    """A per-domain lock with a short TTL, released or extended only by its holder.

    Each acquire puts a random token in the lock; extend and release compare it in Lua
    (``sessions/lock_*``, scripts any client of the same Redis can run), so a holder whose
    lock expired cannot delete or extend the next holder's lock.  Acquiring never waits, and a
    lock that is no longer ours is ``False``, not an exception.

    Held with ``with``, the lock is extended in the background every third of ``ttl_ms``
    until the block ends, so the TTL bounds only how long a dead holder keeps the others
    waiting (:data:`LOCK_TTL_MS`).  Held with :meth:`acquire` by hand, call :meth:`extend`
    more often than every ``ttl_ms``.
    """

    def __init__(self, r: redis.Redis, keys: Keys, domain: str, ttl_ms: int = LOCK_TTL_MS) -> None:
        if not isinstance(ttl_ms, int) or ttl_ms <= 0:
            raise ValueError("ttl_ms must be a positive int")
        self.domain = _normal_domain(domain)
        self.ttl_ms = ttl_ms
        self._redis = r
        self._key = keys.session_lock(self.domain)
        self._acquire = LOCK_ACQUIRE.bind(r)
        self._extend = LOCK_EXTEND.bind(r)
        self._release = LOCK_RELEASE.bind(r)
        self._token: str | None = None
        self._alive: _KeepAlive | None = None

    def __repr__(self) -> str:
        # The token stays out: with it anybody could release our lock.
        return f"SessionLock(domain={self.domain!r}, ttl_ms={self.ttl_ms}, acquired={self.held})"

    @property
    def held(self) -> bool:
        """Whether this instance acquired the lock and has not released it (it may
        have expired since: :meth:`owned` asks Redis)."""
        return self._token is not None

    def acquire(self) -> bool:
        """Take the lock if nobody holds it; never waits."""
        token = secrets.token_hex(16)
        taken = bool(self._acquire({"lock": self._key}, {"token": token, "ttl_ms": self.ttl_ms}))
        self._token = token if taken else None
        return taken

    def release(self) -> bool:
        """Delete the lock if it still holds our token; False if it expired meanwhile."""
        token, self._token = self._token, None
        if token is None:
            return False
        return bool(self._release({"lock": self._key}, {"token": token}))

    def extend(self, ttl_ms: int | None = None) -> bool:
        """Reset the lock's TTL to ``ttl_ms`` (default: the original TTL) if it is ours."""
        ttl = self.ttl_ms if ttl_ms is None else ttl_ms
        if not isinstance(ttl, int) or ttl <= 0:
            raise ValueError("ttl_ms must be a positive int")
        if self._token is None:
            return False
        return bool(self._extend({"lock": self._key}, {"token": self._token, "ttl_ms": ttl}))

    def owned(self) -> bool:
        """Whether Redis still holds our token under the lock key."""
        if self._token is None:
            return False
        return text(self._redis.get(self._key) or "") == self._token

    def __enter__(self) -> SessionLock:
        if not self.acquire():
            raise SessionBusy(f"session lock for {self.domain} is held by another worker")
        self._alive = _KeepAlive(self).__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        alive, self._alive = self._alive, None
        if alive is not None:
            alive.__exit__()
        self.release()


LockFactory = Callable[[str], SessionLock]


class _KeepAlive:
    """Extends a held lock in the background, every third of its TTL, while its holder
    works: a slow login (it may solve a captcha) must not outlive the lock and let a second
    worker log in too.  A Redis error is tried again at the next beat (the lock lives two
    more); a lock found no longer ours ends it."""

    def __init__(self, lock: SessionLock) -> None:
        self._lock = lock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="session-lock-keepalive")
        self._thread.daemon = True

    def __enter__(self) -> _KeepAlive:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._lock.ttl_ms / 3000):
            try:
                if not self._lock.extend():
                    log.warning("lost the session lock for %s while holding it", self._lock.domain)
                    return
            except redis.RedisError as exc:
                log.warning("cannot extend the session lock for %s: %s", self._lock.domain, exc)


# -- re-authenticate once ---------------------------------------------------------------
def _lock_factory(
    store: CookieStore, locks: LockFactory | tuple[redis.Redis, Keys] | None
) -> LockFactory:
    if callable(locks):
        return locks
    r, keys = locks if locks is not None else (store.redis, store.keys)

    def make(domain: str) -> SessionLock:
        return SessionLock(r, keys, domain)

    return make


@dataclass(frozen=True)
class _Reauth:
    store: CookieStore
    make_lock: LockFactory
    domain: str
    login: Callable[[], Mapping[str, str]]
    seen_version: int

    def fresh(self, cookies: Cookies) -> bool:
        # "!=" rather than ">": the counter only grows, and if it was ever deleted a
        # restart from 0 still counts as "changed".
        return bool(cookies) and cookies.version != self.seen_version

    def attempt(self, retry_after_s: float) -> ReauthResult:
        """One non-blocking step: fresh cookies, or log in under the lock, or WAIT."""
        current = self.store.load(self.domain)
        if self.fresh(current):
            return ReauthResult(ReauthStatus.COOKIES, current)
        lock = self.make_lock(self.domain)
        if not lock.acquire():
            return ReauthResult(ReauthStatus.WAIT, Cookies(version=current.version), retry_after_s)
        try:
            return self._login_locked(lock)
        finally:
            lock.release()

    def _login_locked(self, lock: SessionLock) -> ReauthResult:
        # Someone may have finished between our read and our acquire: check again.
        current = self.store.load(self.domain)
        if self.fresh(current):
            return ReauthResult(ReauthStatus.COOKIES, current)
        log.info("re-authenticating %s (stale version %d)", self.domain, self.seen_version)
        with _KeepAlive(lock):
            cookies = _checked_cookies(self.login())
        version = self.store.save(self.domain, cookies)
        return ReauthResult(ReauthStatus.COOKIES, Cookies(cookies, version), logged_in=True)


def try_reauthenticate(
    store: CookieStore,
    locks: LockFactory | tuple[redis.Redis, Keys] | None,
    domain: str,
    login: Callable[[], Mapping[str, str]],
    *,
    seen_version: int,
    retry_after_s: float = 1.0,
) -> ReauthResult:
    """Non-blocking "re-authenticate once", for Celery tasks.

    ``seen_version`` is the version of the cookies found stale (``Cookies.version``).
    Returns COOKIES when a newer session exists or this call logged in (login() runs
    here, under the lock), or WAIT while another worker is logging in: reschedule with
    ``countdown=result.retry_after_s`` and call again.  ``locks`` is a lock factory,
    an ``(r, keys)`` pair, or None for the store's own connection.
    """
    if retry_after_s <= 0:
        raise ValueError("retry_after_s must be positive")
    job = _Reauth(store, _lock_factory(store, locks), _normal_domain(domain), login, seen_version)
    return job.attempt(retry_after_s)


def reauthenticate(
    store: CookieStore,
    locks: LockFactory | tuple[redis.Redis, Keys] | None,
    domain: str,
    login: Callable[[], Mapping[str, str]],
    *,
    seen_version: int,
    wait_s: float = 30.0,
    poll_s: float = 0.1,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Cookies:
    """Blocking "re-authenticate once", for plain scraping code (not Celery tasks).

    Returns cookies newer than ``seen_version``: stored ones if another worker already
    logged in, else the ones this call's login() produced (only the lock holder runs
    it; the others poll every ``poll_s``).  Raises :class:`ReauthTimeout` after
    ``wait_s``; a login() error is re-raised after the lock is released.
    """
    if wait_s <= 0 or poll_s <= 0:
        raise ValueError("wait_s and poll_s must be positive")
    job = _Reauth(store, _lock_factory(store, locks), _normal_domain(domain), login, seen_version)
    deadline = clock() + wait_s
    while True:
        result = job.attempt(poll_s)
        if result.ready:
            return result.cookies
        left = deadline - clock()
        if left <= 0:
            raise ReauthTimeout(f"no fresh session for {job.domain} within {wait_s:g}s")
        sleep(min(poll_s, left))

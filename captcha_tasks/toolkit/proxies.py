"""The shared proxy pool, for your own code: the pool a solve with ``proxy="pool"`` uses.

    from captcha_tasks.toolkit.proxies import ProxyPool

    pool = ProxyPool.from_settings()
    pool.add("user:pass@10.0.0.1:3128", "socks5://10.0.0.2:1080")
    proxy = pool.acquire("session-42")      # sticky: the same proxy while it lives
    pool.quarantine(proxy)                   # the site blocked it: out for a while

See :mod:`captcha_tasks.state.proxies` for how assignments and quarantine work.
"""

from __future__ import annotations

import redis

from ..core.proxyspec import PROXY_TYPES, mask, parse, proxy_id, split
from ..settings import Settings
from ..state.connections import redis_client
from ..state.db import Db
from ..state.keys import Keys
from ..state.lua import Script, text
from ..state.proxies import ProxyLeases

__all__ = ["PROXY_TYPES", "ProxyPool", "mask", "proxy_id", "split"]

RENEW = Script("proxies/renew")

QUARANTINED = Script("proxies/quarantined")


class ProxyPool(ProxyLeases):
    """Proxies shared by many workers: sticky per owner, each assignment with its own TTL."""

    def __init__(
        self,
        r: redis.Redis,
        keys: Keys,
        assignment_ttl_s: float = 600,
        quarantine_s: float = 300,
    ) -> None:
        super().__init__(Db(r, keys), assignment_ttl_s, quarantine_s)
        self._renew = self._db.bind(RENEW)
        self._quarantined = self._db.bind(QUARANTINED)

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> ProxyPool:
        """The deployment's pool: ``REDIS_URL``, ``CAPTCHAAI_KEY_PREFIX`` and
        ``CAPTCHAAI_PROXY_COOLOFF`` of ``settings`` (default: the package app's,
        ``app.settings()`` at this call: those ``app.use`` gave, else the environment's)."""
        if settings is None:
            from ..worker.app import app

            settings = app.settings()
        return cls(
            redis_client(settings),
            Keys(settings.redis.key_prefix),
            quarantine_s=settings.proxies.cooloff,
        )

    def remove(self, proxy: str) -> bool:
        """Take a proxy out of the pool; its holder loses it at its next acquire."""
        canonical = parse(proxy).canonical
        k = self._keys
        with self._r.pipeline(transaction=True) as pipe:
            pipe.srem(k.proxies(), canonical)
            pipe.zrem(k.proxy_quarantine(), canonical)
            pipe.delete(self._owner_key(canonical))
            removed = self._guarded(pipe.execute)[0]
        return bool(removed)

    def all(self) -> list[str]:
        """Every proxy in the pool (with credentials: do not log them, use :func:`mask`)."""
        return sorted(
            text(p) for p in self._guarded(lambda: self._r.smembers(self._keys.proxies()))
        )

    def renew(self, owner: str) -> bool:
        """Reset the TTL of the owner's assignment only; False if it has none."""
        proxy = self.current(owner)
        if proxy is None:
            return False
        keys = {"assignment": self._keys.proxy_assignment(owner), "owner": self._owner_key(proxy)}
        args = {"owner": owner, "proxy": proxy, "ttl_ms": self._ttl_ms}
        return bool(self._guarded(lambda: self._renew(keys, args)))

    def quarantined(self) -> list[str]:
        """Proxies currently cooling off."""
        keys = {"quarantine": self._keys.proxy_quarantine()}
        return sorted(text(p) for p in self._guarded(lambda: self._quarantined(keys)))

"""Token pools kept filled ahead of demand, and the shared proxy list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.poolspec import parse_pools
from .declare import check, proxies, setting


@dataclass(frozen=True)
class PoolSettings:
    """The token pools and their refills (``settings.pools``)."""

    declared: tuple[Any, ...] = setting(
        "CAPTCHAAI_POOLS",
        """token pools, a JSON list of ``{name, method, sitekey, pageurl, size, ttl,
        min_remaining, ...extra solve parameters}``.""",
        (),
        parse=parse_pools,
    )
    reserve: int | None = setting(
        "CAPTCHAAI_POOL_RESERVE",
        """slots pool refills never take (kept for on-demand solves); unset: a fifth of the
        usable threads, at least one.""",
        None,
        parse=int,
    )
    prewarm_every: float = setting(
        "CAPTCHAAI_PREWARM_EVERY",
        "seconds between beat's pool pre-warm ticks.",
        10.0,
        parse=float,
    )

    def __post_init__(self) -> None:
        check("CAPTCHAAI_PREWARM_EVERY", self.prewarm_every > 0, "must be > 0")

    def refill_reserve(self, capacity: int) -> int:
        """Slots of ``capacity`` usable threads that refills leave to on-demand solves."""
        if self.reserve is not None:
            return self.reserve
        return max(1, capacity // 5)


@dataclass(frozen=True)
class ProxySettings:
    """The shared proxy list (``settings.proxies``)."""

    listed: tuple[str, ...] = setting(
        "CAPTCHAAI_PROXIES",
        "proxies for the shared pool, comma or newline separated.",
        (),
        parse=proxies,
        secret=True,
    )
    cooloff: float = setting(
        "CAPTCHAAI_PROXY_COOLOFF",
        "seconds a proxy the API reported bad stays quarantined.",
        300.0,
        parse=float,
    )

    def __post_init__(self) -> None:
        check("CAPTCHAAI_PROXY_COOLOFF", self.cooloff > 0, "must be > 0")

"""Tenants are keys: who is calling the gateway, and how often they may.

A tenant of ``CAPTCHAAI_TENANTS`` that names ``key_env`` is a gateway client; its key is
read from that environment variable once, at start-up (a missing, short or shared key
stops the gateway naming the variable, never showing the key).  A request's key is
compared with every tenant's in constant time (``hmac.compare_digest``, each one, so the
time taken says nothing about which key came close).  Keys live in this process's memory
only: never in Redis, logs, metrics or error messages.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..core.lanes import Tenant
from ..errors import ConfigurationError
from ..serving.buckets import Buckets
from ..settings import Settings

#: Shortest key a tenant may have (CaptchaAI's SDK insists on 32 characters: ``openssl
#: rand -hex 16`` makes one every SDK takes).
MIN_KEY_LENGTH = 16
#: Requests with an unknown key an address may send in a burst, and per second after that
#: (guessing keys is slow work).
WRONG_KEYS_BURST = 20
WRONG_KEYS_PER_S = 1.0


@dataclass(frozen=True)
class _Entry:
    key: bytes = field(repr=False)
    tenant: Tenant


class TenantKeys:
    """The gateway's tenants by key (thread-safe)."""

    def __init__(self, entries: list[_Entry]) -> None:
        self._entries = entries
        self._rates = Buckets()
        self._wrong = Buckets()

    @classmethod
    def from_settings(cls, settings: Settings, environ: Mapping[str, str]) -> TenantKeys:
        """The tenants of ``settings`` that name a ``key_env``, with their keys from
        ``environ``; :class:`ConfigurationError` names what is wrong."""
        entries: list[_Entry] = []
        seen: dict[bytes, str] = {}
        for tenant in settings.tenants.declared.values():
            if tenant.key_env is None:
                continue
            key = environ.get(tenant.key_env, "").strip()
            if len(key) < MIN_KEY_LENGTH:
                raise ConfigurationError(
                    f"{tenant.key_env} (tenant {tenant.name!r}'s gateway key) must be set, at"
                    f" least {MIN_KEY_LENGTH} characters (openssl rand -hex 16 makes one)"
                )
            raw = key.encode()
            if raw in seen:
                raise ConfigurationError(
                    f"{tenant.key_env} holds the same key as {seen[raw]}: every tenant needs"
                    " its own"
                )
            seen[raw] = tenant.key_env
            entries.append(_Entry(raw, tenant))
        if not entries:
            raise ConfigurationError(
                "CAPTCHAAI_TENANTS names no key_env: the gateway would let nobody in (give a"
                ' tenant "key_env": "NAME_OF_A_VARIABLE" holding its key)'
            )
        return cls(entries)

    @property
    def tenants(self) -> list[Tenant]:
        return [e.tenant for e in self._entries]

    def who(self, key: str) -> Tenant | None:
        """The tenant whose key ``key`` is, or None; the time taken does not depend on
        which key (if any) it matches."""
        given = key.strip().encode("utf-8", errors="replace")
        found = None
        for entry in self._entries:
            if hmac.compare_digest(given, entry.key):
                found = entry.tenant
        return found

    def allow(self, tenant: Tenant) -> bool:
        """Count one request of ``tenant``; False when it is over its ``requests_per_s``
        (a burst of one second's worth is allowed)."""
        rate = tenant.requests_per_s
        return self._rates.take(tenant.name, rate, max(1.0, rate))

    def guessing(self, address: str) -> bool:
        """Whether ``address`` has sent too many unknown keys lately."""
        return self._wrong.empty(address, WRONG_KEYS_PER_S, WRONG_KEYS_BURST)

    def wrong_key(self, address: str) -> None:
        """Count one request with an unknown key from ``address``."""
        self._wrong.spend(address, WRONG_KEYS_PER_S, WRONG_KEYS_BURST)

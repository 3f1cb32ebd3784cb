"""One typed settings object, read from the environment in one place.

:class:`Settings` is made of small frozen objects, one per concern (``settings.redis``,
``settings.providers``, ``settings.solving``, ...).  Each field declares its environment
variable, parser and meaning (:func:`~.declare.setting`); :meth:`Settings.from_env` reads them
all, and the settings reference in the documentation is generated from the same fields.
A wrong value raises :class:`~captcha_tasks.errors.ConfigurationError` naming the
variable, at start-up.

Process entry points (the CLI, the worker and beat, the exporter) build their settings
with :func:`get_settings` or take their app's (``app.settings()``); everything below them
is given its settings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from typing import Any

from ..core.providers import parse_providers
from .declare import ENV, HELP, PARSE, Network, check, default_of, parse_value
from .kafka import KafkaSettings
from .pools import PoolSettings, ProxySettings
from .providers import DEFAULT_BASE_URL, AcceptanceSettings, ProviderSettings
from .queues import QUEUE_KINDS, CelerySettings
from .redis import (
    DEFAULT_REDIS_URL,
    SENTINEL_SCHEME,
    RedisSentinel,
    RedisSettings,
    mask_url,
    parse_sentinel,
)
from .servers import GatewaySettings, PingbackSettings
from .solving import SolvingSettings
from .tenants import TenantSettings

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_REDIS_URL",
    "ENVIRONMENT_VARIABLES",
    "PROVIDER_KEY_SLOTS",
    "QUEUE_KINDS",
    "SENTINEL_SCHEME",
    "AcceptanceSettings",
    "CelerySettings",
    "GatewaySettings",
    "KafkaSettings",
    "Network",
    "PingbackSettings",
    "PoolSettings",
    "ProviderSettings",
    "ProxySettings",
    "RedisSentinel",
    "RedisSettings",
    "SettingDoc",
    "Settings",
    "SolvingSettings",
    "TenantSettings",
    "concerns",
    "documented",
    "get_settings",
    "mask_url",
    "parse_sentinel",
    "reset_settings",
]


@dataclass(frozen=True)
class Settings:
    """All of captcha-tasks' configuration, one frozen object per concern."""

    #: Where Redis is (Sentinel included) and the prefix of our keys.
    redis: RedisSettings = field(default_factory=RedisSettings)
    #: The queues, the redelivery of a dead worker's messages, and Flower.
    celery: CelerySettings = field(default_factory=CelerySettings)
    #: The primary provider, the further ones, and how we talk to them.
    providers: ProviderSettings = field(default_factory=ProviderSettings)
    #: Routing by acceptance.
    acceptance: AcceptanceSettings = field(default_factory=AcceptanceSettings)
    #: The timing of one solve: polls, deadline, resubmits, slot lease.
    solving: SolvingSettings = field(default_factory=SolvingSettings)
    #: Token pools.
    pools: PoolSettings = field(default_factory=PoolSettings)
    #: The shared proxy list.
    proxies: ProxySettings = field(default_factory=ProxySettings)
    #: The tenants sharing the account.
    tenants: TenantSettings = field(default_factory=TenantSettings)
    #: The pingback receiver.
    pingback: PingbackSettings = field(default_factory=PingbackSettings)
    #: The gateway.
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    #: The Kafka bridge.
    kafka: KafkaSettings = field(default_factory=KafkaSettings)

    def __post_init__(self) -> None:
        # The checks that span two concerns; each concern checks itself.
        capacity = self.providers.capacity
        reserve = self.pools.reserve
        check(
            "CAPTCHAAI_POOL_RESERVE",
            reserve is None or 0 <= reserve <= capacity,
            "must be between 0 and the usable threads",
        )
        http = self.providers.connect_timeout + self.providers.read_timeout
        check(
            "CAPTCHAAI_VISIBILITY_TIMEOUT",
            self.celery.visibility_timeout > http,
            f"must be longer than CAPTCHAAI_CONNECT_TIMEOUT + CAPTCHAAI_READ_TIMEOUT ({http:g} s):"
            " a message still waiting for the API must not be delivered a second time",
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``environ`` (default: ``os.environ``)."""
        env = os.environ if environ is None else environ
        concerns = {concern.name: _read(_CONCERNS[concern.name], env) for concern in fields(cls)}
        return cls(**concerns)

    def replace(self, **changes: Any) -> Settings:
        """These settings with some concerns changed: each keyword names a concern and
        gives either its new value or a dict of its fields to change
        (``settings.replace(pingback={"secret": s})``).  Every check runs again."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, change in changes.items():
            data[name] = replace(data[name], **change) if isinstance(change, dict) else change
        return Settings(**data)


#: The class of each concern of :class:`Settings`, by its field's name.
_CONCERNS: dict[str, type] = {
    "redis": RedisSettings,
    "celery": CelerySettings,
    "providers": ProviderSettings,
    "acceptance": AcceptanceSettings,
    "solving": SolvingSettings,
    "pools": PoolSettings,
    "proxies": ProxySettings,
    "tenants": TenantSettings,
    "pingback": PingbackSettings,
    "gateway": GatewaySettings,
    "kafka": KafkaSettings,
}


def _read(concern: type, env: Mapping[str, str]) -> Any:
    """One concern's fields from ``env``: each set variable parsed, the rest defaults."""
    values: dict[str, Any] = {}
    for f in fields(concern):
        var = f.metadata[ENV]
        raw = (env.get(var) or "").strip()
        if raw and f.metadata[PARSE] is not None:
            values[f.name] = parse_value(var, raw, f.metadata[PARSE])
    if concern is ProviderSettings:
        # Each further provider's key is in the variable its entry names.
        raw = (env.get("CAPTCHAAI_PROVIDERS") or "").strip()
        if raw:
            values["extra"] = parse_providers(raw, env, values.get("name", "captchaai"))
    return concern(**values)


#: Variables Docker Compose passes to workers for the keys of CAPTCHAAI_PROVIDERS: name one
#: in a provider's ``key_env`` (any other name works outside Compose).
PROVIDER_KEY_SLOTS = ("CAPTCHAAI_PROVIDER_KEY_1", "CAPTCHAAI_PROVIDER_KEY_2")


@dataclass(frozen=True)
class SettingDoc:
    """One setting as the documentation shows it."""

    variable: str
    #: Where Python code reads it: ``<concern>.<field>`` of :class:`Settings`.
    path: str
    default: Any
    #: Its Python type, as its field declares it.
    type: str
    meaning: str
    #: The concern's name (``redis``, ``providers``, ...).
    concern: str


def concerns() -> list[tuple[str, type]]:
    """Each concern of :class:`Settings` in its order: its attribute name and its class."""
    return [(concern.name, _CONCERNS[concern.name]) for concern in fields(Settings)]


def documented() -> list[SettingDoc]:
    """Every setting, concern by concern in the order of :class:`Settings`: its environment
    variable, attribute path, default, type and meaning, from its field's metadata.  The
    reference in the documentation is built from this, so it cannot drift."""
    docs = []
    for name, concern in concerns():
        for f in fields(concern):
            docs.append(
                SettingDoc(
                    variable=f.metadata[ENV],
                    path=f"{name}.{f.name}",
                    default=default_of(f),
                    type=str(f.type),
                    meaning=f.metadata[HELP],
                    concern=name,
                )
            )
    return docs


#: Every environment variable the settings read (used by the compose-file check).
ENVIRONMENT_VARIABLES = frozenset(doc.variable for doc in documented())


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment once: for process entry points
    only (everything else is given its settings)."""
    return Settings.from_env()


def reset_settings() -> None:
    """Forget the cached settings (tests and the quickstart change the environment)."""
    get_settings.cache_clear()

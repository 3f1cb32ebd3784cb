"""Lanes and tenants: how urgent a solve is, and whom its threads are counted against.

A *lane* says how long a caller can wait.  Where the thread limiter hands out a freed
thread (:mod:`captcha_tasks.state.limiter`), parked ``interactive`` work goes first, then
``bulk``, then ``background``; each lane also has a Celery queue of its own for its solve
messages, so a view's captcha never waits in the broker behind a batch's.

============  ==========================================================================
lane          the default of
============  ==========================================================================
interactive   ``solve.delay`` / ``apply_async``, ``aio.solve``
bulk          ``stream()``, ``aio.stream``, ``captcha-tasks batch``, the Kafka bridge
background    pool refills
============  ==========================================================================

A *tenant* is a team or an app sharing the account (``CAPTCHAAI_TENANTS``, JSON)::

    {"shop": {"weight": 2}, "crawler": {"weight": 1, "max_threads": 10, "daily_captchas": 5000}}

Within a lane, freed threads go to the tenants with parked work in proportion to their
``weight`` (an idle tenant's share goes to the others); ``max_threads`` caps the threads a
tenant holds; ``daily_captchas`` is its budget of submitted captchas per UTC day.  A solve
without a tenant belongs to :data:`DEFAULT_TENANT`, which exists without being declared
(weight 1, no cap, no budget, unless ``CAPTCHAAI_TENANTS`` declares it).

Three fields concern the gateway (``captcha-tasks gateway``) only: ``key_env`` names the
environment variable holding the tenant's gateway key (the variable's name is in the
settings, never the key), ``requests_per_s`` caps the tenant's requests to one gateway
process, and ``callback_hosts`` lists the hosts its ``pingback`` / ``callbackUrl`` may
name (:mod:`~captcha_tasks.core.callback_urls`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ValidationError
from .callback_urls import parse_hosts

__all__ = [
    "BACKGROUND",
    "BULK",
    "DEFAULT_TENANT",
    "INTERACTIVE",
    "LANES",
    "Tenant",
    "check_lane",
    "check_tenant",
    "default_lane",
    "is_tenant_name",
    "parse_tenants",
    "tenant_of",
]

INTERACTIVE = "interactive"
BULK = "bulk"
BACKGROUND = "background"
#: Every lane, in the order a freed thread serves them.
LANES = (INTERACTIVE, BULK, BACKGROUND)
DEFAULT_TENANT = "default"
# Tenant names go into Redis hash fields joined by '|' and into metric labels.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
_FIELDS = (
    "weight",
    "max_threads",
    "daily_captchas",
    "key_env",
    "requests_per_s",
    "callback_hosts",
)
#: Requests per second a tenant may send one gateway process, unless it says otherwise:
#: far above what a well-behaved SDK sends (a poll every 5 s per captcha in flight).
DEFAULT_REQUESTS_PER_S = 100.0
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True)
class Tenant:
    """One tenant's share of the account."""

    name: str
    #: Its share of the freed threads, against the other tenants' weights.
    weight: float = 1.0
    #: Most threads it holds at once (None: no cap beyond the account's).
    max_threads: int | None = None
    #: Captchas it may submit per UTC day (None: no budget).
    daily_captchas: int | None = None
    #: The environment variable holding its gateway key (None: not a gateway client).
    key_env: str | None = None
    #: Requests per second it may send one gateway process.
    requests_per_s: float = DEFAULT_REQUESTS_PER_S
    #: The hosts its ``pingback`` / ``callbackUrl`` may name (see
    #: :mod:`~captcha_tasks.core.callback_urls`; empty: no client callbacks).
    callback_hosts: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"weight": self.weight}
        if self.max_threads is not None:
            data["max_threads"] = self.max_threads
        if self.daily_captchas is not None:
            data["daily_captchas"] = self.daily_captchas
        if self.key_env is not None:
            data["key_env"] = self.key_env
        if self.requests_per_s != DEFAULT_REQUESTS_PER_S:
            data["requests_per_s"] = self.requests_per_s
        if self.callback_hosts:
            data["callback_hosts"] = list(self.callback_hosts)
        return data


def parse_tenants(raw: str) -> dict[str, Tenant]:
    """``CAPTCHAAI_TENANTS`` as tenants by name; ``ValueError`` names the tenant and field
    that are wrong."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError('expected a JSON object of name -> {"weight": ..., ...}')
    return {str(name): _tenant(str(name), spec) for name, spec in data.items()}


def _tenant(name: str, spec: Any) -> Tenant:
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"tenant name {name!r} must be 1-64 letters, digits, '_', '.' or '-' "
            "(starting with a letter or digit)"
        )
    if not isinstance(spec, dict):
        raise ValueError(f"tenant {name!r} must be a JSON object")
    unknown = sorted(set(spec) - set(_FIELDS))
    if unknown:
        raise ValueError(
            f"tenant {name!r} has unknown field(s) {', '.join(unknown)} "
            f"(known: {', '.join(_FIELDS)})"
        )
    weight = spec.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise ValueError(f"tenant {name!r}: weight must be a number")
    if not (math.isfinite(weight) and weight > 0):
        raise ValueError(f"tenant {name!r}: weight must be > 0")
    return Tenant(
        name,
        float(weight),
        _count(name, "max_threads", spec.get("max_threads"), least=1),
        _count(name, "daily_captchas", spec.get("daily_captchas"), least=0),
        _key_env(name, spec.get("key_env")),
        _rate(name, spec.get("requests_per_s", DEFAULT_REQUESTS_PER_S)),
        parse_hosts(name, spec.get("callback_hosts")),
    )


def _key_env(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        raise ValueError(
            f"tenant {name!r}: key_env must name an environment variable (letters, digits"
            " and '_'), not hold the key"
        )
    return value


def _rate(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"tenant {name!r}: requests_per_s must be a number")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"tenant {name!r}: requests_per_s must be > 0")
    return float(value)


def _count(name: str, field: str, value: Any, least: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"tenant {name!r}: {field} must be a whole number")
    if value < least:
        raise ValueError(f"tenant {name!r}: {field} must be at least {least}")
    return value


def check_lane(lane: Any) -> str:
    """``lane`` when it is one of :data:`LANES`, else :class:`ValidationError`."""
    if lane not in LANES:
        raise ValidationError(f"unknown lane {lane!r}: use one of {', '.join(LANES)}")
    return str(lane)


def is_tenant_name(name: Any) -> bool:
    """Whether ``name`` can name a tenant (declared or not)."""
    return isinstance(name, str) and bool(_NAME.fullmatch(name))


def check_tenant(tenant: Any, tenants: Mapping[str, Tenant]) -> str:
    """``tenant`` when it is declared (or is :data:`DEFAULT_TENANT`), else
    :class:`ValidationError` listing the tenants there are."""
    if tenant == DEFAULT_TENANT or (isinstance(tenant, str) and tenant in tenants):
        return str(tenant)
    known = sorted({DEFAULT_TENANT, *tenants})
    raise ValidationError(
        f"unknown tenant {tenant!r}: CAPTCHAAI_TENANTS declares {', '.join(known)}"
    )


def default_lane(*, batch: bool) -> str:
    """The lane of a solve whose caller named none: a batch's (``stream()``, ``aio.stream``,
    ``captcha-tasks batch``) is bulk work, anything else is a caller waiting."""
    return BULK if batch else INTERACTIVE


def tenant_of(name: str, tenants: Mapping[str, Tenant]) -> Tenant:
    """The tenant ``name`` (an undeclared one, the default tenant among them: weight 1, no
    cap, no budget)."""
    return tenants.get(name) or Tenant(name)

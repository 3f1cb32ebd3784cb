"""The providers a deployment solves with: the primary (``CAPTCHAAI_*``) and the further
ones of ``CAPTCHAAI_PROVIDERS``, each an account of its own on an API that speaks
``in.php`` / ``res.php`` (kinds ``captchaai``, ``2captcha``) or the JSON family's
``createTask`` / ``getTaskResult`` (kinds ``anticaptcha``, ``capsolver``, ``capmonster``:
one :class:`~.dialects.Dialect` each).

A :class:`ProviderSpec` is one provider as configured: where it is, its key (read from the
environment variable the configuration names, never from the JSON), its threads, the
methods it takes, its *role* and its *kind*.  The kind brings the provider's request
budgets (:data:`KIND_BUDGETS`): CaptchaAI sells threads and publishes no per-second limit;
2captcha bans clients above 60 ``in.php`` requests per 3 s, above 3 NO_SLOT errors per
captcha, and above 20 ``res.php`` requests per captcha (+ 1,200) an hour.  A JSON kind's
budgets are per task and live in its dialect (CapMonster: 2 s between polls, 120 polls;
CapSolver: 120 polls).  Every account budget can be overridden per provider.

The kind is the protocol: a JSON kind's ``base_url`` is the API root
(``https://api.anti-captcha.com``), and a provider whose dialect has no task type for a
method does not take it (:meth:`ProviderSpec.supports`), as one whose ``methods`` leave it
out.

Roles, in the order the providers are listed (the primary first):

* ``primary``: where captchas go while it is up;
* ``fallback``: takes new captchas while every provider before it is down (or does not
  take the method);
* ``overflow``: takes them then too, and also when the primary's threads are all busy
  and a captcha would wait longer than ``CAPTCHAAI_OVERFLOW_AFTER``.

Pure values, no I/O; every problem is a :class:`~captcha_tasks.errors.ConfigurationError`
naming the variable, the provider and the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal
from urllib.parse import urlsplit

from ..errors import ConfigurationError
from ..methods import METHODS
from .dialects import DIALECTS

__all__ = [
    "IN_PHP_KINDS",
    "KIND_BUDGETS",
    "KINDS",
    "ROLES",
    "Budgets",
    "ProviderSpec",
    "base_url_problem",
    "parse_budgets",
    "parse_providers",
]

ENV_VAR = "CAPTCHAAI_PROVIDERS"
Role = Literal["primary", "fallback", "overflow"]
Kind = Literal["captchaai", "2captcha", "anticaptcha", "capsolver", "capmonster"]
Wire = Literal["in.php", "json"]
ROLES: tuple[Role, ...] = ("primary", "fallback", "overflow")
KINDS: tuple[Kind, ...] = ("captchaai", "2captcha", "anticaptcha", "capsolver", "capmonster")
#: The kinds that speak in.php / res.php; every other kind is a JSON dialect.
IN_PHP_KINDS = frozenset({"captchaai", "2captcha"})
#: Endpoints of either protocol: a ``base_url`` ending in one names an endpoint, not the
#: API root the client appends them to.
_ENDPOINTS = frozenset({"in.php", "res.php", "createtask", "gettaskresult", "getbalance"})
#: Provider names go into Redis key names, metric labels and logs.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]{0,31}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Budgets:
    """A provider's request budgets (None: no such budget)."""

    #: ``in.php`` requests per :attr:`submit_window_s`, across every worker.
    submit_rate: int | None = None
    submit_window_s: float = 3.0
    #: NO_SLOT errors allowed per captcha submitted (counted by the hour).
    no_slot_ratio: float | None = None
    #: ``res.php`` requests an hour: ``res_per_captcha`` × captchas + ``res_base``.
    res_per_captcha: int | None = None
    res_base: int = 1200


#: Each kind's budgets (see the module docstring).
KIND_BUDGETS: dict[str, Budgets] = {
    "captchaai": Budgets(),
    "2captcha": Budgets(submit_rate=60, no_slot_ratio=3.0, res_per_captcha=20, res_base=1200),
    # The JSON family's published limits are per task (the dialect's poll gap and polls).
    "anticaptcha": Budgets(),
    "capsolver": Budgets(),
    "capmonster": Budgets(),
}
#: The budget fields ``CAPTCHAAI_BUDGETS`` and a provider entry may override (null: none).
BUDGET_FIELDS = ("submit_rate", "no_slot_ratio", "res_per_captcha", "res_base")


@dataclass(frozen=True)
class ProviderSpec:
    """One provider as configured."""

    name: str
    base_url: str
    api_key: str = field(repr=False)
    #: The plan's concurrent threads (a cap: captchas beyond it wait).
    threads: int
    role: Role = "primary"
    kind: Kind = "captchaai"
    #: The methods it takes (None: all).
    methods: frozenset[str] | None = None
    budgets: Budgets = field(default_factory=Budgets)
    #: Threads left to another client of the key (the primary's CAPTCHAAI_THREADS_RESERVED).
    reserved: int = 0
    #: Where the key came from, for messages (never the key itself).
    key_env: str = "CAPTCHAAI_API_KEY"

    @property
    def capacity(self) -> int:
        """Threads this deployment may use at the provider."""
        return self.threads - self.reserved

    @property
    def primary(self) -> bool:
        return self.role == "primary"

    @property
    def protocol(self) -> Wire:
        """``in.php`` (``in.php`` / ``res.php``) or ``json`` (``createTask`` ...)."""
        return "in.php" if self.kind in IN_PHP_KINDS else "json"

    def supports(self, method: str, proxied: bool = False, variant: str = "") -> bool:
        """Whether it takes ``method`` (with a proxy, when ``proxied``; in ``variant``, see
        :func:`~captcha_tasks.core.dialects.variant_of`): its ``methods`` list it (or are
        all), and its dialect has a task type for it (a JSON kind)."""
        if self.methods is not None and method not in self.methods:
            return False
        dialect = DIALECTS.get(self.kind)
        return dialect is None or dialect.supports(method, proxied, variant)

    def describe(self) -> dict[str, Any]:
        """What ``captcha-tasks providers`` and the docs show (no key)."""
        return {
            "name": self.name,
            "role": self.role,
            "kind": self.kind,
            "protocol": self.protocol,
            "base_url": self.base_url,
            "threads": self.threads,
            "methods": sorted(self.methods) if self.methods is not None else None,
            "key_env": self.key_env,
        }


def parse_budgets(raw: Any, kind: str, where: str) -> Budgets:
    """The budgets of ``kind`` with the overrides of ``raw`` (a JSON object, or None)."""
    budgets = KIND_BUDGETS[kind]
    if raw is None:
        return budgets
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{where} must be a JSON object of budget -> value")
    unknown = sorted(set(raw) - set(BUDGET_FIELDS))
    if unknown:
        raise ConfigurationError(
            f"{where} has unknown budget {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(BUDGET_FIELDS)})"
        )
    changes: dict[str, Any] = {}
    for name, value in raw.items():
        if value is None and name != "res_base":
            changes[name] = None
            continue
        number = _number(value, f"{where}: {name}")
        if name in ("submit_rate", "res_per_captcha", "res_base"):
            if number != int(number) or number < (0 if name == "res_base" else 1):
                raise ConfigurationError(f"{where}: {name} must be a whole number >= 1")
            number = int(number)
        elif number <= 0:
            raise ConfigurationError(f"{where}: {name} must be > 0")
        changes[name] = number
    return replace(budgets, **changes)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{where} must be a number (or null for none)")
    return float(value)


_FIELDS = {"name", "base_url", "key_env", "threads", "methods", "role", "kind", *BUDGET_FIELDS}


def parse_providers(
    raw: str, environ: Mapping[str, str], primary: str = "captchaai"
) -> tuple[ProviderSpec, ...]:
    """``CAPTCHAAI_PROVIDERS``: a JSON list of further providers, their keys read from
    ``environ``.  ``primary`` is the primary's name (no other may take it)."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigurationError(f"{ENV_VAR} is not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise ConfigurationError(f"{ENV_VAR} must be a JSON list of provider objects")
    specs: list[ProviderSpec] = []
    seen = {primary}
    for index, entry in enumerate(data):
        spec = _provider(entry, index, environ)
        if spec.name in seen:
            what = "the primary's name (CAPTCHAAI_PROVIDER_NAME)" if spec.name == primary else ""
            raise ConfigurationError(
                f"{ENV_VAR}: provider name {spec.name!r} is used twice"
                + (f": it is {what}" if what else "")
            )
        seen.add(spec.name)
        specs.append(spec)
    return tuple(specs)


def _provider(entry: Any, index: int, environ: Mapping[str, str]) -> ProviderSpec:
    if not isinstance(entry, Mapping):
        raise ConfigurationError(f"{ENV_VAR}[{index}] must be a JSON object")
    name = entry.get("name")
    label = f"{ENV_VAR}[{index}]" + (f" ({name!r})" if isinstance(name, str) else "")
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise ConfigurationError(
            f"{label}: unknown field {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(sorted(_FIELDS))})"
        )
    for required in ("name", "base_url", "key_env", "threads"):
        if required not in entry:
            raise ConfigurationError(f"{label}: {required} is required")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ConfigurationError(
            f"{label}: name must be 1-32 letters, digits, '_' or '-' (starting with a letter"
            " or digit)"
        )
    kind = entry.get("kind", "2captcha")
    if kind not in KINDS:
        raise ConfigurationError(
            f"{label}: kind {kind!r} is not one of {', '.join(KINDS)}"
            if isinstance(kind, str)
            else f"{label}: kind must be one of {', '.join(KINDS)}"
        )
    base_url = entry["base_url"]
    problem = base_url_problem(base_url, kind)
    if problem:
        raise ConfigurationError(f"{label}: base_url {problem}")
    key_env = entry["key_env"]
    if not isinstance(key_env, str) or not _ENV_NAME.fullmatch(key_env):
        raise ConfigurationError(f"{label}: key_env must name an environment variable")
    # A process that calls no API (the exporter, Flower, an app) may run without the key;
    # a worker refuses to start without it (see captcha_tasks.worker.startup).
    key = environ.get(key_env, "").strip()
    threads = entry["threads"]
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigurationError(f"{label}: threads must be a whole number >= 1")
    role = entry.get("role", "fallback")
    if role not in ("fallback", "overflow"):
        raise ConfigurationError(f'{label}: role must be "fallback" or "overflow"')
    budgets = {k: entry[k] for k in BUDGET_FIELDS if k in entry}
    return ProviderSpec(
        name=name,
        base_url=base_url.rstrip("/"),
        api_key=key,
        threads=threads,
        role=role,
        kind=kind,
        methods=_methods(entry.get("methods"), label),
        budgets=parse_budgets(budgets or None, kind, label),
        key_env=key_env,
    )


def base_url_problem(base_url: Any, kind: str) -> str | None:
    """What is wrong with ``base_url`` for a provider of ``kind`` (None: nothing): an
    http(s) URL of the API root, to which the client appends the endpoints."""
    parts = urlsplit(base_url) if isinstance(base_url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL"
    if parts.query or parts.fragment:
        return "must not carry a query string or fragment (it is the API root)"
    last = parts.path.rstrip("/").rpartition("/")[2]
    if last.lower() in _ENDPOINTS:
        example = (
            "https://api.anti-captcha.com"
            if kind not in IN_PHP_KINDS
            else "https://ocr.captchaai.com"
        )
        return (
            f"must be the API root, without the endpoint /{last} (for a {kind} provider,"
            f" e.g. {example}; the endpoints are appended)"
        )
    return None


def _methods(raw: Any, label: str) -> frozenset[str] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw or not all(isinstance(m, str) for m in raw):
        raise ConfigurationError(f"{label}: methods must be a non-empty list of method names")
    unknown = sorted(set(raw) - set(METHODS))
    if unknown:
        raise ConfigurationError(
            f"{label}: unknown method {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(sorted(METHODS))})"
        )
    return frozenset(raw)

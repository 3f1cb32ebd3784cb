"""How one setting is declared, read and checked: :func:`setting` puts its environment
variable, its parser and its meaning in the field's metadata, where the builder
(:func:`captcha_tasks.settings.from_env`) and the reference in the documentation read them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import MISSING, Field, field
from ipaddress import IPv4Network, IPv6Network, ip_network
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..core.proxyspec import mask, split
from ..errors import ConfigurationError

T = TypeVar("T")
#: An IPv4 or IPv6 network, as CAPTCHAAI_PINGBACK_ALLOW and ..._TRUSTED_PROXIES list them.
Network = IPv4Network | IPv6Network
#: A parser of one variable's text; None: the builder reads the variable itself.
Parse = Callable[[str], Any] | None

#: The keys of a setting's field metadata.
ENV, HELP, PARSE = "env", "help", "parse"


def setting(
    env: str,
    meaning: str,
    default: Any = MISSING,
    *,
    parse: Parse = str,
    factory: Callable[[], Any] | None = None,
    secret: bool = False,
) -> Any:
    """A field read from the environment variable ``env`` with ``parse``, meaning ``meaning``
    (reStructuredText, shown in the settings reference); a ``secret`` stays out of repr."""
    metadata = {ENV: env, HELP: " ".join(meaning.split()), PARSE: parse}
    if factory is not None:
        return field(default_factory=factory, repr=not secret, metadata=metadata)
    return field(default=default, repr=not secret, metadata=metadata)


def default_of(f: Field[Any]) -> Any:
    """The value ``f`` takes when its variable is unset."""
    if f.default_factory is not MISSING:
        return f.default_factory()
    return f.default


def check(var: str, ok: bool, why: str) -> None:
    """Fail with one line naming ``var`` unless ``ok``."""
    if not ok:
        raise ConfigurationError(f"{var} {why}")


def check_url(var: str, value: str, schemes: tuple[str, ...]) -> None:
    parts = urlsplit(value)
    if parts.scheme not in schemes or (parts.scheme != "unix" and not parts.hostname):
        raise ConfigurationError(f"{var} must be a {' / '.join(s + '://' for s in schemes)} URL")


def check_networks(var: str, networks: tuple[Network, ...]) -> None:
    check(
        var,
        all(isinstance(n, IPv4Network | IPv6Network) for n in networks),
        "must be a list of networks (ipaddress.ip_network values)",
    )


def parse_value(var: str, raw: str, parse: Callable[[str], T]) -> T:
    """``parse(raw)``; a failure is one :class:`ConfigurationError` line naming ``var``."""
    try:
        return parse(raw)
    except ConfigurationError:
        raise
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"{var} has an invalid value: {exc}") from None


def no_slash(raw: str) -> str:
    return raw.rstrip("/")


def lower(raw: str) -> str:
    return raw.lower()


def lifetimes(raw: str) -> dict[str, float]:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object of method -> seconds")
    return {str(k): float(v) for k, v in data.items()}


def proxies(raw: str) -> tuple[str, ...]:
    items = tuple(p.strip() for p in raw.replace("\n", ",").split(",") if p.strip())
    for index, proxy in enumerate(items):
        try:
            split(proxy)
        except ValueError as exc:
            raise ValueError(f"proxy #{index} ({mask(proxy)}): {exc}") from None
    return items


def networks(raw: str) -> tuple[Network, ...]:
    found = []
    for item in raw.replace(",", " ").split():
        try:
            # strict=False: 10.1.2.3/8 means the /8 it lies in, as firewalls read it
            found.append(ip_network(item, strict=False))
        except ValueError:
            raise ValueError(
                f"{item!r} is not an address or a CIDR network (like 203.0.113.0/24 or"
                " 2001:db8::/32)"
            ) from None
    return tuple(found)


def budgets(raw: str) -> dict[str, Any]:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object of budget -> value")
    return data


def flag(raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected 1/0, true/false, yes/no or on/off, got {raw!r}")


def client_config(raw: str) -> dict[str, Any]:
    # The values may be secrets (SASL passwords): errors name keys, never values.
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object of librdkafka setting -> value")
    for key, value in data.items():
        if not isinstance(value, str | int | float | bool):
            raise ValueError(f"{key!r} must be a string, number or boolean")
    return {str(k): v for k, v in data.items()}

"""Which client callbacks the gateway makes: a tenant's ``callback_hosts`` allowlist, the
judgement of a ``pingback`` / ``callbackUrl`` against it, and the addresses a delivery may
connect to.  Pure values, no I/O: the gateway judges a URL at submit, and the worker that
delivers judges it again, then each address its host resolved to, before it connects.

* **Entries.**  A ``callback_hosts`` entry is a host name or an IP address, lower-cased,
  with an optional port: ``hooks.shop.example``, ``hooks.shop.example:8443``,
  ``10.1.2.3:8080``, ``[fd00::7]:9000``.  Without a port an entry allows the scheme's own
  port only (80 for ``http``, 443 for ``https``); with one, that port only.  No scheme,
  user, path or wildcard.
* **URLs.**  ``http`` or ``https``, no user information (``user:pass@``), a host and port
  that an entry allows exactly (``shop.example`` does not allow ``a.shop.example``), at
  most :data:`MAX_URL` characters.  The fragment is dropped, the query kept.
* **Addresses.**  A host *name* on the list is followed only to public addresses: a DNS
  record that points inside (loopback, private, link-local: a cloud's metadata service)
  is refused at delivery.  A callback to an address inside is allowed by listing that
  *address* (``127.0.0.1:8080``): the operator named it, so it is meant.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

__all__ = [
    "DEFAULT_PORTS",
    "MAX_URL",
    "RETRY_DELAYS_S",
    "Refused",
    "Target",
    "address_allowed",
    "judge",
    "parse_hosts",
    "retry_delay",
]

DEFAULT_PORTS = {"http": 80, "https": 443}
#: Longest callback URL taken (characters).
MAX_URL = 2048
#: Seconds before each new try of a delivery that failed (then it is given up).
RETRY_DELAYS_S = (1.0, 5.0, 30.0)
#: Most entries a tenant lists.
MAX_HOSTS = 100
_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_ENTRY = re.compile(r"(?P<host>\[[0-9a-f:.]+\]|[^:\[\]]+)(?::(?P<port>[0-9]{1,5}))?")


@dataclass(frozen=True)
class Target:
    """A callback URL the list allows: where to connect, and what to ask for there."""

    url: str
    scheme: str
    #: The host as written (lower-cased; an IPv6 address without brackets).
    host: str
    port: int
    #: The request target: the path and the query.
    target: str

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"

    @property
    def literal(self) -> bool:
        """Whether the host is an IP address (it is then the one address it connects to)."""
        return _address(self.host) is not None


@dataclass(frozen=True)
class Refused:
    """A callback URL the gateway does not call: why, in words a client can act on."""

    reason: str


def parse_hosts(tenant: str, value: Any) -> tuple[str, ...]:
    """A tenant's ``callback_hosts`` as normalized entries; ``ValueError`` naming the
    tenant and the field for a bad one."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_HOSTS:
        raise ValueError(
            f"tenant {tenant!r}: callback_hosts must be a list of at most {MAX_HOSTS} hosts"
        )
    return tuple(dict.fromkeys(_entry(tenant, item) for item in value))


def _entry(tenant: str, item: Any) -> str:
    text = item.strip().lower() if isinstance(item, str) else ""
    found = _ENTRY.fullmatch(text)
    host = _host(found.group("host")) if found else None
    port = found.group("port") if found else None
    if host is None or (port is not None and not 0 < int(port) < 65536):
        raise ValueError(
            f"tenant {tenant!r}: callback_hosts entry {item!r} must be a host name or an IP"
            " address, with an optional :port (no scheme, user, path or wildcard)"
        )
    return _key(host, int(port) if port else None)


def _host(text: str) -> str | None:
    if text.startswith("["):
        found = _address(text[1:-1])
        return str(found) if found is not None and found.version == 6 else None
    found = _address(text)
    if found is not None:
        return str(found)
    return text.rstrip(".") if _NAME.fullmatch(text.rstrip(".")) else None


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _key(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


def judge(url: Any, hosts: Iterable[str]) -> Target | Refused:
    """The :class:`Target` of ``url`` when ``hosts`` (a tenant's entries) allow it, else
    :class:`Refused`."""
    if not isinstance(url, str) or not url.strip():
        return Refused("the callback URL is empty")
    url = url.strip()
    if len(url) > MAX_URL:
        return Refused(f"the callback URL is longer than {MAX_URL} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return Refused("the callback URL cannot be read")
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        return Refused("the callback URL must be http or https")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return Refused("the callback URL must not carry a user or password")
    host = _host(parts.hostname or "")
    if host is None or any(c in url for c in "\r\n\t "):
        return Refused("the callback URL has no valid host")
    port = port if port is not None else DEFAULT_PORTS[scheme]
    listed = set(hosts)
    bare = _key(host, None)
    if _key(host, port) not in listed and not (bare in listed and port == DEFAULT_PORTS[scheme]):
        return Refused(
            f"the callback host {_key(host, port)} is not on this tenant's callback_hosts"
        )
    return Target(url, scheme, host, port, _request_target(parts))


def _request_target(parts: SplitResult) -> str:
    path = parts.path or "/"
    return f"{path}?{parts.query}" if parts.query else path


def address_allowed(target: Target, address: str) -> bool:
    """Whether a delivery to ``target`` may connect to ``address`` (one its host resolved
    to): the listed address itself, or a public one for a listed name."""
    found = _address(address.split("%", 1)[0])
    if found is None or found.is_unspecified or found.is_multicast:
        return False
    if target.literal:
        return found == _address(target.host)
    mapped = getattr(found, "ipv4_mapped", None)
    return bool((mapped or found).is_global)


def retry_delay(tries: int) -> float | None:
    """Seconds before the next try of a delivery that failed ``tries`` times (None: give
    up)."""
    return RETRY_DELAYS_S[tries - 1] if 0 < tries <= len(RETRY_DELAYS_S) else None

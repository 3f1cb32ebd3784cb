"""Proxy addresses: parsing, the API's ``(proxy, proxytype)`` form, masking.

Proxy strings are ``[type://][user:password@]host:port`` (type ``http`` (default),
``https``, ``socks4``, ``socks5``).  They are stored canonically (type lower-case,
``http://`` omitted); key names use a short hash, and logs, reprs and errors show them
masked (``user:***@host:port``) only.  A malformed proxy's error never echoes it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

__all__ = ["PROXY_TYPES", "Proxy", "mask", "parse", "proxy_id", "split"]

#: Prefix -> the ``proxytype`` the API expects.
PROXY_TYPES = {"http": "HTTP", "https": "HTTPS", "socks4": "SOCKS4", "socks5": "SOCKS5"}
_HOST_RE = re.compile(r"^(?:[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?|\[[0-9A-Fa-f:.]+\])$")
_FORMAT = "expected [type://][user:password@]host:port"


@dataclass(frozen=True)
class Proxy:
    """A parsed proxy address."""

    kind: str  # a PROXY_TYPES key
    host: str
    port: int
    user: str = ""
    password: str = field(default="", repr=False)

    def _address(self, password: str) -> str:
        creds = f"{self.user}:{password}@" if self.user else ""
        return f"{creds}{self.host}:{self.port}"

    def _prefixed(self, address: str) -> str:
        return address if self.kind == "http" else f"{self.kind}://{address}"

    @property
    def address(self) -> str:
        return self._address(self.password)

    @property
    def canonical(self) -> str:
        return self._prefixed(self.address)

    @property
    def masked(self) -> str:
        return self._prefixed(self._address("***"))


def _invalid(reason: str) -> ValueError:
    # Never echoes the input: it may hold a password in any position.
    return ValueError(f"invalid proxy ({_FORMAT}): {reason}")


def _split_kind(text: str) -> tuple[str, str]:
    kind, sep, rest = text.partition("://")
    if not sep:
        return "http", text
    if kind.lower() not in PROXY_TYPES:
        raise _invalid(f"type must be one of {', '.join(PROXY_TYPES)}")
    return kind.lower(), rest


def _split_credentials(creds: str) -> tuple[str, str]:
    user, colon, password = creds.partition(":")
    if not user or not colon or not password:
        raise _invalid("credentials must be user:password")
    return user, password


def parse(proxy: str) -> Proxy:
    if not isinstance(proxy, str):
        raise TypeError("proxy must be a str")
    text = proxy.strip()
    if not text or any(ch.isspace() for ch in text):
        raise _invalid("empty or contains whitespace")
    kind, rest = _split_kind(text)
    creds, at, hostport = rest.rpartition("@")
    user, password = _split_credentials(creds) if at else ("", "")
    host, colon, port = hostport.rpartition(":")
    if not colon or not _HOST_RE.match(host):
        raise _invalid("missing or malformed host")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise _invalid("port must be a number 1-65535")
    return Proxy(kind, host.lower(), int(port), user, password)


def mask(proxy: str) -> str:
    """``proxy`` with its password replaced by ``***`` (safe to log)."""
    try:
        return parse(proxy).masked
    except (TypeError, ValueError):
        pass
    return _mask_malformed(proxy) if isinstance(proxy, str) else "***"


def _mask_malformed(text: str) -> str:
    # Keep only what cannot be a secret: the type, the user before a ':' and the host.
    kind, sep, rest = text.partition("://")
    if not (sep and kind.isalnum()):
        kind, sep, rest = "", "", text
    creds, at, host = rest.rpartition("@")
    if not at:
        return "***"
    user, colon, _ = creds.partition(":")
    return f"{kind}{sep}{user}:***@{host}" if colon else f"{kind}{sep}***@{host}"


def split(proxy: str) -> tuple[str, str]:
    """The API's ``(proxy, proxytype)`` pair: ``("user:pass@host:port", "SOCKS5")``."""
    parsed = parse(proxy)
    return parsed.address, PROXY_TYPES[parsed.kind]


def proxy_id(proxy: str) -> str:
    """Short stable id of a proxy for key names (credentials never appear in keys)."""
    return hashlib.sha1(parse(proxy).canonical.encode()).hexdigest()[:16]

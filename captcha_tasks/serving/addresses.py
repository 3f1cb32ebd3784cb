"""Who is calling: the client address behind trusted reverse proxies, and the allowlist.

A reverse proxy hides its clients: every request comes from the proxy's address, so a
per-address budget would be shared by the provider and whoever attacks it.  A proxy we
trust (``CAPTCHAAI_PINGBACK_TRUSTED_PROXIES``, ``CAPTCHAAI_GATEWAY_TRUSTED_PROXIES``)
appends the address it saw to ``X-Forwarded-For``; everything to the left of that was
written by the client and may be forged.  So the client is the right-most address that
is *not* a trusted proxy::

    X-Forwarded-For: 6.6.6.6, 203.0.113.7, 10.0.0.2     (peer 10.0.0.3; 10.0.0.0/8 trusted)
                     forged   the client   a proxy

Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from ipaddress import IPv4Address, IPv6Address, ip_address

from ..settings import Network

Address = IPv4Address | IPv6Address


def parse_address(text: str) -> Address | None:
    """An address as a socket or a proxy writes it (``::ffff:a.b.c.d`` is read as IPv4;
    ``[v6]:port`` and ``a.b.c.d:port`` lose their port); ``None`` if it is none."""
    value = text.strip()
    if value.startswith("["):
        value = value[1:].partition("]")[0]
    elif value.count(":") == 1:
        value = value.partition(":")[0]
    try:
        address = ip_address(value)
    except ValueError:
        return None
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def normalized(text: str) -> str:
    """``text`` written the one way :func:`parse_address` reads it (unchanged if it is not
    an address), so one client is one key of the per-address budgets."""
    address = parse_address(text)
    return text if address is None else str(address)


def within(text: str, networks: Sequence[Network]) -> bool:
    """Whether the address ``text`` lies in one of ``networks``."""
    address = parse_address(text)
    return address is not None and any(address in network for network in networks)


def allowed(text: str, allow: Sequence[Network]) -> bool:
    """Whether the allowlist ``allow`` lets ``text`` in (an empty list lets all in)."""
    return not allow or within(text, allow)


def client_address(
    peer: str, forwarded_for: str | Sequence[str] | None, trusted: Sequence[Network]
) -> str:
    """The address a request is judged by: ``peer``, unless it is a trusted proxy; then
    the right-most ``X-Forwarded-For`` hop outside ``trusted`` (``forwarded_for``: the
    header's value, or its values when it came more than once, in order)."""
    current = normalized(peer)
    if not forwarded_for or not within(peer, trusted):
        return current
    joined = forwarded_for if isinstance(forwarded_for, str) else ",".join(forwarded_for)
    for hop in reversed([h for h in joined.split(",") if h.strip()]):
        address = parse_address(hop)
        if address is None:  # unreadable: nobody we trust wrote it, stop at the last proxy
            return current
        current = str(address)
        if not any(address in network for network in trusted):
            return current
    return current  # every hop is a proxy of ours: the one furthest out

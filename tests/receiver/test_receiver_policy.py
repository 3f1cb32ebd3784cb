"""The receiver's pure policy: who the client is behind trusted proxies, the allowlist, and
which connections come in (no network, no Redis)."""

from __future__ import annotations

from ipaddress import ip_network

import pytest

from captcha_tasks.errors import ConfigurationError
from captcha_tasks.serving.addresses import allowed, client_address, normalized, parse_address
from captcha_tasks.serving.limits import Admit, Limits, Refusal, admit

pytestmark = pytest.mark.unit

PROXIES = (ip_network("10.0.0.0/8"), ip_network("2001:db8:feed::/48"))


@pytest.mark.parametrize(
    ("peer", "forwarded_for", "client"),
    [
        # not a proxy of ours: whatever it claims is ignored
        ("198.51.100.9", "203.0.113.7", "198.51.100.9"),
        # a proxy of ours: the address it appended
        ("10.0.0.3", "203.0.113.7", "203.0.113.7"),
        # what the client wrote left of it is forged and skipped
        ("10.0.0.3", "6.6.6.6, 203.0.113.7", "203.0.113.7"),
        # through two proxies of ours: the right-most hop that is not one
        ("10.0.0.3", "6.6.6.6, 203.0.113.7, 10.0.0.2", "203.0.113.7"),
        # the header given more than once reads as one list, in order
        ("10.0.0.3", ["6.6.6.6", "203.0.113.7, 10.0.0.2"], "203.0.113.7"),
        # no header: the proxy itself
        ("10.0.0.3", None, "10.0.0.3"),
        ("10.0.0.3", "", "10.0.0.3"),
        # every hop is ours: the one furthest out
        ("10.0.0.3", "10.9.9.9, 10.0.0.2", "10.9.9.9"),
        # an unreadable hop: trust stops at the last proxy that wrote a readable one
        ("10.0.0.3", "203.0.113.7, unknown, 10.0.0.2", "10.0.0.2"),
        ("10.0.0.3", "garbage", "10.0.0.3"),
        # ports, brackets, IPv6 and IPv4-mapped peers
        ("10.0.0.3", "203.0.113.7:4711", "203.0.113.7"),
        ("10.0.0.3", "[2001:db8::1]:4711", "2001:db8::1"),
        ("::ffff:10.0.0.3", "203.0.113.7", "203.0.113.7"),
        ("2001:db8:feed::1", "2001:db8::1", "2001:db8::1"),
        ("::ffff:198.51.100.9", None, "198.51.100.9"),
    ],
)
def test_the_client_behind_trusted_proxies(
    peer: str, forwarded_for: str | list[str] | None, client: str
) -> None:
    assert client_address(peer, forwarded_for, PROXIES) == client


def test_without_trusted_proxies_the_header_is_never_read() -> None:
    assert client_address("10.0.0.3", "203.0.113.7", ()) == "10.0.0.3"


def test_addresses_are_read_one_way() -> None:
    assert str(parse_address("::ffff:127.0.0.2")) == "127.0.0.2"
    assert parse_address("not an address") is None
    assert normalized("::FFFF:127.0.0.2") == "127.0.0.2"
    assert normalized("") == ""


def test_the_allowlist() -> None:
    allow = (ip_network("203.0.113.0/24"), ip_network("2001:db8::/32"))
    assert allowed("203.0.113.200", allow)
    assert allowed("::ffff:203.0.113.1", allow)
    assert allowed("2001:db8::5", allow)
    assert not allowed("203.0.114.1", allow)
    assert not allowed("", allow)
    assert allowed("198.51.100.1", ())  # empty: everyone


LIMITS = Limits(max_connections=10, max_per_address=3)


def test_admission() -> None:
    def decide(**overrides: object) -> Admit | Refusal:
        args: dict[str, object] = dict(
            allowed=True, proxy=False, from_address=0, total=0, evictable=0
        )
        args.update(overrides)
        return admit(LIMITS, **args)  # type: ignore[arg-type]

    assert decide() == Admit()
    assert decide(allowed=False) is Refusal.NOT_ALLOWED
    # a trusted proxy's clients are judged once its headers name them
    assert decide(allowed=False, proxy=True) == Admit()
    assert decide(from_address=2) == Admit()
    assert decide(from_address=3) is Refusal.PER_ADDRESS
    assert decide(from_address=3, proxy=True) == Admit()  # a proxy is many clients
    assert decide(total=10, evictable=4) == Admit(evict=True)
    assert decide(total=10, evictable=0) is Refusal.FULL
    assert decide(allowed=False, from_address=3, total=10) is Refusal.NOT_ALLOWED


def test_limits_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="max_per_address must be > 0"):
        Limits(max_per_address=0)

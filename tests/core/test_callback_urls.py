"""Which client callbacks the gateway makes (core.callback_urls): a tenant's
``callback_hosts`` entries, a ``pingback`` / ``callbackUrl`` judged against them, the
addresses a delivery may connect to, and its retries.  No I/O."""

from __future__ import annotations

import pytest

from captcha_tasks.core.callback_urls import (
    RETRY_DELAYS_S,
    Refused,
    Target,
    address_allowed,
    judge,
    parse_hosts,
    retry_delay,
)

pytestmark = pytest.mark.unit

HOSTS = parse_hosts(
    "shop", ["Hooks.Shop.Example", "api.shop.example:8443", "127.0.0.1:8080", "[FD00::7]:9000"]
)


def test_entries_are_lower_cased_and_checked() -> None:
    assert HOSTS == (
        "hooks.shop.example",
        "api.shop.example:8443",
        "127.0.0.1:8080",
        "[fd00::7]:9000",
    )
    assert parse_hosts("shop", None) == ()
    for bad in (
        "https://hooks.shop.example",
        "user@hooks.shop.example",
        "hooks.shop.example/path",
        "*.shop.example",
        "hooks.shop.example:0",
        "hooks.shop.example:99999",
        "-bad-.example",
        "",
        7,
        "[::1",
    ):
        with pytest.raises(ValueError, match=r"tenant 'shop': callback_hosts entry"):
            parse_hosts("shop", [bad])
    with pytest.raises(ValueError, match=r"tenant 'shop': callback_hosts must be a list"):
        parse_hosts("shop", "hooks.shop.example")


@pytest.mark.parametrize(
    ("url", "host", "port", "target"),
    [
        ("https://hooks.shop.example/cb?x=1#frag", "hooks.shop.example", 443, "/cb?x=1"),
        ("http://HOOKS.shop.example", "hooks.shop.example", 80, "/"),
        ("https://api.shop.example:8443/in", "api.shop.example", 8443, "/in"),
        ("http://127.0.0.1:8080/hook", "127.0.0.1", 8080, "/hook"),
        ("http://[fd00::7]:9000/h", "fd00::7", 9000, "/h"),
    ],
)
def test_a_listed_host_and_port_is_allowed(url: str, host: str, port: int, target: str) -> None:
    judged = judge(url, HOSTS)
    assert isinstance(judged, Target), judged
    assert (judged.host, judged.port, judged.target) == (host, port, target)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://evil.example/cb", "not on this tenant's callback_hosts"),
        ("https://a.hooks.shop.example/cb", "not on this tenant's callback_hosts"),
        ("https://hooks.shop.example.evil.example/", "not on this tenant's callback_hosts"),
        ("https://hooks.shop.example:444/cb", "hooks.shop.example:444 is not on"),
        ("https://api.shop.example/cb", "api.shop.example:443 is not on"),
        ("http://127.0.0.1:8081/hook", "127.0.0.1:8081 is not on"),
        ("http://127.0.0.1/hook", "127.0.0.1:80 is not on"),
        ("http://localhost:8080/hook", "not on"),
        ("ftp://hooks.shop.example/", "http or https"),
        ("gopher://127.0.0.1:8080/", "http or https"),
        ("https://user:pw@hooks.shop.example/", "user or password"),
        ("https://evil.example@hooks.shop.example/", "user or password"),
        ("https://hooks.shop.example:x/", "cannot be read"),
        ("https:///cb", "no valid host"),
        ("https://hooks.shop.example/a b", "no valid host"),
        ("", "empty"),
        (None, "empty"),
        ("https://hooks.shop.example/" + "a" * 3000, "longer than"),
    ],
)
def test_anything_else_is_refused_with_a_reason(url: object, why: str) -> None:
    judged = judge(url, HOSTS)
    assert isinstance(judged, Refused) and why in judged.reason, judged
    assert isinstance(judge("https://hooks.shop.example/", ()), Refused)


def test_a_listed_name_reaches_public_addresses_only_a_listed_address_itself() -> None:
    named = judge("https://hooks.shop.example/cb", HOSTS)
    listed = judge("http://127.0.0.1:8080/hook", HOSTS)
    assert isinstance(named, Target) and isinstance(listed, Target)
    assert address_allowed(named, "93.184.216.34")
    assert address_allowed(named, "2606:2800:220:1:248:1893:25c8:1946")
    for inside in (
        "127.0.0.1",
        "10.0.0.5",
        "192.168.1.1",
        "172.16.0.1",
        "169.254.169.254",
        "::1",
        "fd00::7",
        "::ffff:127.0.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "not an address",
    ):
        assert not address_allowed(named, inside), inside
    assert address_allowed(listed, "127.0.0.1")
    assert not address_allowed(listed, "127.0.0.2")
    assert listed.host_header == "127.0.0.1:8080" and named.host_header == "hooks.shop.example"


def test_retries_back_off_then_give_up() -> None:
    assert [retry_delay(n) for n in range(1, len(RETRY_DELAYS_S) + 2)] == [
        *RETRY_DELAYS_S,
        None,
    ]
    assert list(RETRY_DELAYS_S) == sorted(RETRY_DELAYS_S)

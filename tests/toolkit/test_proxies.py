"""The shared proxy pool: affinity, per-assignment TTLs, quarantine, on a real Redis."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from captcha_tasks.state.keys import Keys
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.toolkit.proxies import ProxyPool, mask, proxy_id, split

pytestmark = pytest.mark.redis

PASSWORD = "hunter2-s3cret"
PROXIES = [f"user{i}:{PASSWORD}@10.0.0.{i}:8080" for i in range(1, 6)]


def make_pool(redis_conn: Any, keys: Keys, *proxies: str, **kwargs: float) -> ProxyPool:
    pool = ProxyPool(redis_conn, keys, **kwargs)
    pool.add(*proxies)
    return pool


def test_add_remove_all_and_canonical_form(redis_conn: Any, keys: Keys) -> None:
    pool = make_pool(redis_conn, keys, *PROXIES[:2])
    assert pool.add(PROXIES[0], "HTTP://" + PROXIES[0]) == 0  # the same proxy, spelled twice
    assert pool.add("socks5://u:p@Proxy.example:1080", "host:3128") == 2
    assert pool.all() == sorted([*PROXIES[:2], "socks5://u:p@proxy.example:1080", "host:3128"])
    assert pool.remove("host:3128") and not pool.remove("host:3128")
    assert "host:3128" not in pool.all()


def test_acquire_is_sticky(redis_conn: Any, keys: Keys) -> None:
    pool = make_pool(redis_conn, keys, *PROXIES[:3])
    first = pool.acquire("worker-a")
    assert first in PROXIES
    assert pool.acquire("worker-a") == first
    assert pool.current("worker-a") == first
    other = pool.acquire("worker-b")
    assert other is not None and other != first
    assert pool.acquire("worker-a") == first


def test_each_assignment_has_its_own_ttl(redis_conn: Any, keys: Keys) -> None:
    # Two views of one pool, whose holders renew for 10 minutes and for 0.3 s: the
    # assignments expire on the Redis server's clock, which no test offset moves.
    pool = make_pool(redis_conn, keys, *PROXIES[:2])
    brief = ProxyPool(redis_conn, keys, assignment_ttl_s=0.3)
    a, b = pool.acquire("a"), brief.acquire("b")
    assert a and b and a != b
    assert pool.renew("a") and redis_conn.pttl(keys.proxy_assignment("a")) > 590_000
    wait_until(lambda: pool.current("b") is None, 3, what="b's assignment to expire")
    assert pool.current("a") == a and pool.acquire("a") == a
    assert redis_conn.pttl(keys.proxy_assignment("a")) > 0
    assert redis_conn.pttl(keys.proxy_owner(proxy_id(a))) > 0
    assert not redis_conn.exists(keys.proxy_owner(proxy_id(b)))
    assert pool.acquire("c") == b  # b's proxy is free again
    assert not pool.renew("b")


def test_concurrent_acquires_never_share_a_proxy(redis_conn: Any, keys: Keys) -> None:
    pool = make_pool(redis_conn, keys, *PROXIES)
    start = threading.Barrier(10)
    got: list[str | None] = []
    guard = threading.Lock()

    def worker(n: int) -> None:
        start.wait()
        proxy = pool.acquire(f"owner-{n}")
        with guard:
            got.append(proxy)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    taken = [p for p in got if p is not None]
    assert len(got) == 10 and got.count(None) == 5
    assert sorted(taken) == sorted(PROXIES)


def test_quarantine_excludes_then_returns(
    redis_conn: Any, keys: Keys, move_clock: Callable[[float], None]
) -> None:
    bad, good = PROXIES[:2]
    pool = make_pool(redis_conn, keys, bad, good, quarantine_s=5)
    assert pool.acquire("holder") in (bad, good)
    pool.release("holder")
    pool.quarantine(bad)
    assert pool.quarantined() == [bad]
    assert pool.acquire("x") == good
    assert pool.acquire("y") is None
    move_clock(5.1)  # the cool-off
    assert pool.acquire("y") == bad
    assert pool.quarantined() == []


def test_quarantine_drops_the_current_assignment(redis_conn: Any, keys: Keys) -> None:
    pool = make_pool(redis_conn, keys, *PROXIES[:2])
    held = pool.acquire("a")
    assert held is not None
    pool.quarantine(held, cool_off_s=30)
    assert pool.current("a") is None and not pool.renew("a")
    assert pool.acquire("a") not in (held, None)


def test_replace_quarantines_and_gives_another_proxy(redis_conn: Any, keys: Keys) -> None:
    pool = make_pool(redis_conn, keys, *PROXIES[:3])
    failed = pool.acquire("captcha-1")
    fresh = pool.replace("captcha-1")
    assert fresh is not None and fresh != failed
    assert pool.quarantined() == [failed]
    assert pool.acquire("captcha-1") == fresh
    assert pool.replace("nobody-yet") not in (None, failed, fresh)


def test_release_only_by_the_owner(redis_conn: Any, keys: Keys) -> None:
    pool = make_pool(redis_conn, keys, PROXIES[0])
    held = pool.acquire("a")
    assert held == PROXIES[0]
    assert not pool.release("b")  # b holds nothing
    assert pool.current("a") == held and pool.acquire("b") is None
    # a's last renewal is a brief one and it expires, b takes the proxy; a's late release
    # must not free it.
    assert ProxyPool(redis_conn, keys, assignment_ttl_s=0.15).renew("a")
    wait_until(lambda: pool.acquire("b") == held, 3, what="a's assignment to expire")
    assert not pool.release("a")
    assert pool.current("b") == held
    assert pool.release("b") and pool.acquire("a") == held


def test_removed_proxy_is_not_handed_out(redis_conn: Any, keys: Keys) -> None:
    pool = make_pool(redis_conn, keys, *PROXIES[:2])
    held = pool.acquire("a")
    assert held is not None
    pool.remove(held)
    again = pool.acquire("a")
    assert again is not None and again != held and again in pool.all()


def test_split_and_mask() -> None:
    assert split("u:p@h.example:3128") == ("u:p@h.example:3128", "HTTP")
    assert split("SOCKS5://u:p@h.example:1080") == ("u:p@h.example:1080", "SOCKS5")
    assert split("https://h.example:443") == ("h.example:443", "HTTPS")
    assert split("socks4://[::1]:1080") == ("[::1]:1080", "SOCKS4")
    assert mask(f"socks5://bob:{PASSWORD}@h:1") == "socks5://bob:***@h:1"
    assert mask(f"bob:{PASSWORD}@h:1") == "bob:***@h:1"
    assert mask("h:1") == "h:1"
    assert mask(f"bob:{PASSWORD}@h") == "bob:***@h"  # invalid, still masked
    assert mask(f"h:1:bob:{PASSWORD}") == "***"
    assert mask(f"{PASSWORD}@h:1") == "***@h:1"  # a token-only credential
    assert mask(f"bob:x://{PASSWORD}@h:1") == "bob:***@h:1"
    assert mask(f"socks5://{PASSWORD}@h") == "socks5://***@h"


@pytest.mark.parametrize(
    "bad",
    [
        f"bob:{PASSWORD}@host",
        f"bob:{PASSWORD}@host:99999",
        f"bob:{PASSWORD}@host:port",
        f"ftp://bob:{PASSWORD}@host:21",
        f"bob{PASSWORD}@host:1",
        f"host:1:bob:{PASSWORD}",
        f"bob:{PASSWORD} @host:1",
    ],
)
def test_invalid_proxies_never_echo_the_password(redis_conn: Any, keys: Keys, bad: str) -> None:
    pool = ProxyPool(redis_conn, keys)
    with pytest.raises(ValueError) as err:
        pool.add("ok:1", bad)
    assert PASSWORD not in str(err.value) and "proxy #1" in str(err.value)
    assert pool.all() == []  # all or nothing
    with pytest.raises(ValueError) as err:
        split(bad)
    assert PASSWORD not in str(err.value)


def test_credentials_never_in_repr_logs_or_key_names(
    redis_conn: Any, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    pool = make_pool(redis_conn, keys, *PROXIES[:2])
    held = pool.acquire("a")
    assert held is not None
    with caplog.at_level("DEBUG", logger="captcha_tasks.state.proxies"):
        pool.replace("a")
    assert caplog.text and PASSWORD not in caplog.text and mask(held) in caplog.text
    assert PASSWORD not in repr(pool)
    names = list(redis_conn.scan_iter(keys.all_patterns()))
    assert names and not any(PASSWORD in n or "10.0.0" in n for n in names)

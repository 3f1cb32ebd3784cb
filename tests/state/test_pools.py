"""Token pools against a real Redis server: definitions, exactly-once takes, expiry, plans."""

from __future__ import annotations

import json
import multiprocessing
import threading
from typing import Any

import pytest
import redis

from captcha_tasks.errors import ConfigurationError, ValidationError
from captcha_tasks.methods import build_request
from captcha_tasks.state.db import Db
from captcha_tasks.state.keys import Keys
from captcha_tasks.state.pools import (
    PoolNotFound,
    PoolSpec,
    PoolStore,
    parse_pools,
)
from captcha_tasks.testing.processes import wait_until

pytestmark = pytest.mark.redis

SITE = "https://example.com/login"
RC = {
    "name": "rc-login",
    "method": "userrecaptcha",
    "sitekey": "6Lc-site",
    "pageurl": SITE,
    "size": 5,
    "ttl": 110,
    "min_remaining": 10,
    "version": "v3",
    "action": "login",
    "min_score": 0.7,
}
TS = {
    "name": "ts-home",
    "method": "turnstile",
    "sitekey": "0x4AAA",
    "pageurl": "https://example.com/",
    "size": 3,
    "ttl": 280,
    "min_remaining": 20,
}


def spec(**changes: Any) -> PoolSpec:
    return PoolSpec.from_dict({**TS, **changes})


def token(n: int | str) -> dict[str, Any]:
    return {"token": f"tok-{n}", "captcha_id": str(n), "method": "turnstile"}


def captcha_id(taken: dict[str, Any] | None) -> str:
    assert taken is not None, "expected a token, got a miss"
    return str(taken["captcha_id"])


@pytest.fixture
def store(redis_conn: redis.Redis, keys: Keys) -> PoolStore:
    return PoolStore(Db(redis_conn, keys))


# -- definitions ------------------------------------------------------------------------


def test_parse_pools_reads_flat_objects() -> None:
    rc, ts = parse_pools(json.dumps([RC, TS]))
    assert (rc.name, rc.method, rc.sitekey, rc.pageurl) == (
        "rc-login",
        "userrecaptcha",
        "6Lc-site",
        SITE,
    )
    assert (rc.size, rc.ttl, rc.min_remaining) == (5, 110.0, 10.0)
    assert rc.params == {"version": "v3", "action": "login", "min_score": 0.7}
    assert ts.params == {}
    assert rc.solve_kwargs() == {
        "method": "userrecaptcha",
        "sitekey": "6Lc-site",
        "pageurl": SITE,
        "version": "v3",
        "action": "login",
        "min_score": 0.7,
    }
    assert PoolSpec.from_dict(rc.to_dict()) == rc
    assert parse_pools("") == () == parse_pools("  ")


def test_friendly_captcha_pools_match_its_version() -> None:
    pool = spec(name="fc", method="friendly_captcha", sitekey="FCMG")
    assert pool.matches(build_request("friendly_captcha", "FCMG", TS["pageurl"]))
    assert pool.matches(build_request("friendly_captcha", "FCMG", TS["pageurl"], version="v1"))
    assert not pool.matches(build_request("friendly_captcha", "FCMG", TS["pageurl"], version="v2"))
    assert not pool.matches(build_request("turnstile", "FCMG", TS["pageurl"]))


@pytest.mark.parametrize(
    ("pools", "fragments"),
    [
        ("not json", ["not valid JSON"]),
        ('{"name": "x"}', ["JSON list", "object"]),
        ('["rc"]', ["item #0", "JSON object", "string"]),
        ([{**TS, "name": ""}], ["item #0", "(unnamed)", "name"]),
        ([TS, {k: v for k, v in TS.items() if k != "name"}], ["item #1", "(unnamed)", "name"]),
        ([TS, RC, TS], ["item #2", "'ts-home'", "name", "duplicate of item #0"]),
        ([{**TS, "name": "a:b"}], ["item #0", "'a:b'", "name"]),
        ([{**TS, "method": "hcaptcha"}], ["item #0", "'ts-home'", "method 'hcaptcha' is unknown"]),
        ([{**TS, "method": "geetest"}], ["'ts-home'", "method 'geetest' cannot be pooled"]),
        *(
            ([{**TS, "method": m}], ["'ts-home'", f"method {m!r} cannot be pooled"])
            for m in ("grid", "bls", "cloudflare_challenge", "captchafox", "lemin")
        ),
        ([{**TS, "sitekey": None}], ["'ts-home'", "missing field(s) sitekey"]),
        ([{**TS, "sitekey": " "}], ["'ts-home'", "sitekey"]),
        ([{k: v for k, v in TS.items() if k != "pageurl"}], ["'ts-home'", "pageurl"]),
        ([{**TS, "pageurl": "example.com/x"}], ["'ts-home'", "pageurl must be an http(s) URL"]),
        ([{**TS, "size": 0}], ["'ts-home'", "size"]),
        ([{**TS, "size": 2.5}], ["'ts-home'", "size"]),
        ([{**TS, "size": True}], ["'ts-home'", "size"]),
        ([{**TS, "ttl": 0}], ["'ts-home'", "ttl must be > 0"]),
        ([{**TS, "ttl": "60"}], ["'ts-home'", "ttl must be a finite number"]),
        ([{**TS, "min_remaining": -1}], ["'ts-home'", "min_remaining must be >= 0"]),
        ([{**TS, "ttl": 20}], ["'ts-home'", "ttl", "ttl shorter than min_remaining"]),
        ([{**TS, "ttl": 10}], ["'ts-home'", "ttl shorter than min_remaining"]),
        ([{**TS, "colour": "red"}], ["'ts-home'", "unknown parameter", "colour"]),
        ([{**TS, "proxy": "1.2.3.4:80"}], ["'ts-home'", "proxy", "bind a token"]),
        ([{**RC, "min_score": 2}], ["'rc-login'", "min_score"]),
    ],
)
def test_parse_pools_rejects(pools: Any, fragments: list[str]) -> None:
    text = pools if isinstance(pools, str) else json.dumps(pools)
    with pytest.raises(ConfigurationError) as info:
        parse_pools(text)
    message = str(info.value)
    assert "CAPTCHAAI_POOLS" in message
    for fragment in fragments:
        assert fragment in message


def test_parse_pools_rejects_non_finite_numbers() -> None:
    with pytest.raises(ConfigurationError, match="ttl must be a finite number"):
        parse_pools(
            '[{"name": "n", "method": "turnstile", "sitekey": "k", '
            '"pageurl": "https://a.example/", "size": 1, "ttl": NaN, "min_remaining": 0}]'
        )


def test_matches_same_site_and_solve_parameters_only() -> None:
    rc = PoolSpec.from_dict(RC)
    same = build_request(
        "userrecaptcha", "6Lc-site", SITE, version="v3", action="login", min_score=RC["min_score"]
    )
    assert rc.matches(same)
    # a token solved for another score is not what the caller asked for
    assert not rc.matches(
        build_request(
            "userrecaptcha", "6Lc-site", SITE, version="v3", action="login", min_score=0.3
        )
    )
    assert not rc.matches(
        build_request("userrecaptcha", "6Lc-site", SITE, version="v3", action="login")
    )
    assert not rc.matches(
        build_request("userrecaptcha", "6Lc-site", SITE, version="v3", action="buy")
    )
    assert not rc.matches(build_request("userrecaptcha", "6Lc-site", SITE, action="login"))
    assert not rc.matches(
        build_request("userrecaptcha", "6Lc-other", SITE, version="v3", action="login")
    )
    assert not rc.matches(
        build_request("userrecaptcha", "6Lc-site", SITE + "?x", version="v3", action="login")
    )
    assert not rc.matches(build_request("turnstile", "6Lc-site", SITE, action="login"))
    for bound in (
        {"proxy": "1.2.3.4:80"},
        {"cookies": "a=b"},
        {"data-s": "x"},
        {"userAgent": "UA"},
    ):
        assert not rc.matches(
            build_request("userrecaptcha", "6Lc-site", SITE, version="v3", action="login", **bound)
        )
    v2 = PoolSpec.from_dict(
        {**RC, "name": "v2", "version": "v2", "action": None, "min_score": None}
    )
    assert v2.params == {"version": "v2"}
    # An absent version means v2 to the API, so it fits a pool declared as v2.
    assert v2.matches(build_request("userrecaptcha", "6Lc-site", SITE))


def test_register_get_find_unregister(store: PoolStore) -> None:
    rc, ts = parse_pools(json.dumps([RC, TS]))
    assert store.register(rc) is True
    assert store.register(ts) is True
    assert store.register(ts) is False
    assert store.get("rc-login") == rc
    assert [s.name for s in store.all()] == ["rc-login", "ts-home"]
    assert store.find(build_request("turnstile", "0x4AAA", "https://example.com/")) == ts
    assert (
        store.find(
            build_request(
                "userrecaptcha",
                "6Lc-site",
                SITE,
                version="v3",
                action="login",
                min_score=RC["min_score"],
            )
        )
        == rc
    )
    proxied = build_request("turnstile", "0x4AAA", "https://example.com/", proxy="1.2.3.4:8080")
    assert store.find(proxied) is None
    assert store.find(build_request("turnstile", "0x4AAA", "https://example.com/other")) is None
    with pytest.raises(PoolNotFound, match="'nope'") as info:
        store.get("nope")
    assert info.value.code == "ERROR_POOL_NOT_FOUND"
    assert isinstance(info.value, ValidationError)
    assert store.unregister("ts-home") is True
    assert store.unregister("ts-home") is False
    with pytest.raises(PoolNotFound):
        store.get("ts-home")


def test_redefining_what_a_pool_solves_drops_its_tokens(store: PoolStore) -> None:
    store.register(spec())
    store.add("ts-home", token(1), 100)
    store.register(spec(size=9))  # same site: tokens still fit
    assert store.live("ts-home") == 1
    store.register(spec(sitekey="0x4BBB"))  # another site: the old tokens would be rejected
    assert store.live("ts-home") == 0


def test_undeclared_pool_raises(store: PoolStore) -> None:
    for call in (
        lambda: store.take("ghost"),
        lambda: store.add("ghost", token(1), 10),
        lambda: store.refill_started("ghost", "r1", 10),
        lambda: store.live("ghost"),
        lambda: store.sweep("ghost"),
        lambda: store.status("ghost"),
        lambda: store.plan("ghost", solve_time_s=1, margin_s=1, free_slots=5),
    ):
        with pytest.raises(PoolNotFound, match="'ghost'"):
            call()


# -- tokens -----------------------------------------------------------------------------


def test_take_returns_soonest_expiring_usable_token_once(store: PoolStore) -> None:
    store.register(spec(ttl=280, min_remaining=0))
    for n, life in ((1, 90), (2, 30), (3, 60)):
        assert store.add("ts-home", token(n), life) is True
    assert store.add("ts-home", token(2), 50) is False  # already pooled
    first = store.take("ts-home")
    assert first is not None
    assert first["captcha_id"] == "2"
    assert first["token"] == "tok-2"
    assert 29 < first["remaining_s"] <= 30
    assert [captcha_id(store.take("ts-home")) for _ in range(2)] == ["3", "1"]
    assert store.take("ts-home") is None
    assert store.live("ts-home") == 0


def test_life_is_capped_at_the_pool_ttl(store: PoolStore) -> None:
    store.register(spec(ttl=50, min_remaining=0))
    store.add("ts-home", token(1), 300)
    got = store.take("ts-home")
    assert got is not None and 49 < got["remaining_s"] <= 50


def test_add_refuses_dead_tokens(store: PoolStore) -> None:
    store.register(spec())
    assert store.add("ts-home", token(1), 0) is False
    assert store.add("ts-home", token(2), -5) is False
    assert store.status("ts-home")["added"] == 0
    assert store.live("ts-home") == 0


def test_expired_tokens_are_never_returned_and_count_as_waste(
    store: PoolStore, redis_conn: redis.Redis, keys: Keys
) -> None:
    store.register(spec(min_remaining=0))
    store.add("ts-home", token("old"), 0.2)
    # Later pushes must not keep the first token alive (no key TTL refreshed on push).
    for n in range(3):
        store.add("ts-home", token(n), 100)
    assert redis_conn.ttl(keys.pool_tokens("ts-home")) == -1
    wait_until(lambda: store.live("ts-home") == 3, 3, what="the 0.2 s token to expire")
    taken = [store.take("ts-home") for _ in range(4)]
    assert [t["captcha_id"] for t in taken if t] == ["0", "1", "2"]
    assert taken[3] is None
    status = store.status("ts-home")
    assert (status["added"], status["expired"], status["taken"], status["misses"]) == (4, 1, 3, 1)
    assert status["waste"] == pytest.approx(0.25)


def test_sweep_counts_expired_tokens(store: PoolStore) -> None:
    store.register(spec(min_remaining=0))
    store.add("ts-home", token(1), 0.2)
    store.add("ts-home", token(2), 0.2)
    store.add("ts-home", token(3), 100)
    assert store.live("ts-home", 0) == 3
    wait_until(lambda: store.live("ts-home") == 1, 3, what="two tokens to expire")
    assert store.status("ts-home")["expired"] == 0  # reads do not count waste
    assert store.sweep("ts-home") == 2
    assert store.sweep("ts-home") == 0
    assert store.status("ts-home")["expired"] == 2


def test_min_remaining_is_respected(store: PoolStore) -> None:
    store.register(spec(ttl=280, min_remaining=20))
    store.add("ts-home", token("short"), 5)
    assert store.live("ts-home") == 1
    assert store.live("ts-home", 20) == 0
    assert store.take("ts-home") is None  # 5 s left < the pool's 20 s
    got = store.take("ts-home", min_remaining_s=1)
    assert got is not None and got["captcha_id"] == "short"
    store.add("ts-home", token("long"), 100)
    store.add("ts-home", token("mid"), 30)
    assert captcha_id(store.take("ts-home", min_remaining_s=50)) == "long"
    status = store.status("ts-home")
    assert (status["taken"], status["misses"], status["hit_rate"]) == (2, 1, pytest.approx(2 / 3))


# -- exactly once under contention ------------------------------------------------------


def _drain(redis_url: str, prefix: str, name: str, ready: Any, go: Any, out: Any) -> None:
    """Child process: take until the pool is empty; report what was taken."""
    conn = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        pools = PoolStore(Db(conn, Keys(prefix=prefix)))
        conn.ping()
        ready.put(1)
        go.wait(30)
        got = []
        while (item := pools.take(name)) is not None:
            got.append(item["captcha_id"])
        out.put(got)
    finally:
        conn.close()


def test_every_token_is_taken_exactly_once_by_threads_and_processes(
    store: PoolStore, redis_conn: redis.Redis, redis_url: str, keys: Keys
) -> None:
    n_tokens, n_threads, n_procs = 1500, 8, 3
    store.register(spec(size=n_tokens, min_remaining=0))
    for n in range(n_tokens):
        store.add("ts-home", token(n), 200)
    ctx = multiprocessing.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_drain, args=(redis_url, keys.prefix, "ts-home", ready, go, out))
        for _ in range(n_procs)
    ]
    for p in procs:
        p.start()
    thread_got: list[list[str]] = [[] for _ in range(n_threads)]

    def drain_here(mine: list[str]) -> None:
        conn = redis.Redis.from_url(redis_url, decode_responses=True)
        pools = PoolStore(Db(conn, keys))
        go.wait(30)
        while (item := pools.take("ts-home")) is not None:
            mine.append(item["captcha_id"])
        conn.close()

    threads = [threading.Thread(target=drain_here, args=(g,)) for g in thread_got]
    try:
        for t in threads:
            t.start()
        for _ in procs:
            ready.get(timeout=30)
        go.set()  # everyone starts taking at once
        proc_got = [out.get(timeout=30) for _ in procs]
        for t in threads:
            t.join(30)
    finally:
        go.set()
        for p in procs:
            p.join(30)
        ready.close()
        out.close()
    assert all(p.exitcode == 0 for p in procs)
    handed_out = [cid for got in thread_got + proc_got for cid in got]
    assert len(handed_out) == n_tokens  # none handed out twice
    assert set(handed_out) == {str(n) for n in range(n_tokens)}  # none lost
    assert sum(len(got) for got in proc_got) > 0 and sum(len(got) for got in thread_got) > 0
    status = store.status("ts-home")
    assert status["taken"] == n_tokens
    assert status["misses"] == n_threads + n_procs  # each taker stops at its first miss
    assert status["live"] == 0


# -- refills and planning ---------------------------------------------------------------


def test_inflight_counts_until_finished_or_stale(store: PoolStore) -> None:
    store.register(spec())
    store.refill_started("ts-home", "r1", 60)
    store.refill_started("ts-home", "r2", 0.2)
    assert store.inflight("ts-home") == 2
    assert store.refill_finished("ts-home", "r1") is True
    assert store.refill_finished("ts-home", "r1") is False
    wait_until(lambda: store.inflight("ts-home") == 0, 3, what="the stale refill to drop")


def test_plan_cold_pool_fills_to_size(store: PoolStore) -> None:
    store.register(spec(size=5, min_remaining=10))
    assert store.plan("ts-home", solve_time_s=5, margin_s=2, free_slots=100) == 5
    assert store.plan("ts-home", solve_time_s=5, margin_s=2, free_slots=2) == 2
    assert store.plan("ts-home", solve_time_s=5, margin_s=2, free_slots=0) == 0
    store.refill_started("ts-home", "r1", 60)
    store.refill_started("ts-home", "r2", 60)
    store.add("ts-home", token(1), 100)
    assert store.plan("ts-home", solve_time_s=5, margin_s=2, free_slots=100) == 2
    # A token that will be below min_remaining by the time a refill lands is not cover.
    store.add("ts-home", token(2), 12)
    assert store.live("ts-home") == 2
    assert store.plan("ts-home", solve_time_s=5, margin_s=2, free_slots=100) == 2
    assert store.plan("ts-home", solve_time_s=1, margin_s=2, free_slots=100) == 1
    store.refill_finished("ts-home", "r1")
    assert store.plan("ts-home", solve_time_s=5, margin_s=2, free_slots=100) == 3


def test_plan_follows_the_measured_take_rate(store: PoolStore) -> None:
    store.register(spec(size=20, min_remaining=0))
    store.reset_stats("ts-home")
    for _ in range(5):
        assert store.take("ts-home") is None
    # The pool is younger than a second: the rate is measured over one second.
    assert store.take_rate("ts-home") == pytest.approx(5.0)
    assert store.plan("ts-home", solve_time_s=1, margin_s=0.5, free_slots=100) == 8
    assert store.plan("ts-home", solve_time_s=1, margin_s=0.5, free_slots=3) == 3
    assert store.plan("ts-home", solve_time_s=100, margin_s=0, free_slots=100) == 20
    store.add("ts-home", token(1), 100)
    store.add("ts-home", token(2), 100)
    store.refill_started("ts-home", "r1", 60)
    assert store.plan("ts-home", solve_time_s=1, margin_s=0.5, free_slots=100) == 5
    status = store.status("ts-home", solve_time_s=1, margin_s=0.5)
    assert status["target"] == 8 and status["take_rate"] == pytest.approx(5.0)
    # Old takes leave a short window.
    wait_until(lambda: store.take_rate("ts-home", window_s=0.2) == 0.0, 3, what="window")


def test_plan_target_is_at_least_one_with_any_history(store: PoolStore) -> None:
    store.register(spec(size=4, min_remaining=0))
    store.reset_stats("ts-home")
    store.take("ts-home")
    assert store.plan("ts-home", solve_time_s=0, margin_s=0, free_slots=10) == 1
    store.reset_stats("ts-home")  # no history again: cold
    assert store.plan("ts-home", solve_time_s=0, margin_s=0, free_slots=10) == 4


def test_status_fields(store: PoolStore) -> None:
    store.register(spec(size=3, min_remaining=0))
    cold = store.status("ts-home", solve_time_s=1, margin_s=1)
    assert cold == {
        "name": "ts-home",
        "target": 3,
        "size": 3,
        "live": 0,
        "inflight": 0,
        "added": 0,
        "taken": 0,
        "expired": 0,
        "misses": 0,
        "hit_rate": None,
        "waste": None,
        "take_rate": 0.0,
    }
    store.add("ts-home", token(1), 100)
    store.add("ts-home", token(2), 100)
    store.refill_started("ts-home", "r1", 60)
    store.take("ts-home")
    store.take("ts-home")
    store.take("ts-home")
    status = store.status("ts-home", solve_time_s=1, margin_s=1)
    assert {k: status[k] for k in ("live", "inflight", "added", "taken", "misses", "expired")} == {
        "live": 0,
        "inflight": 1,
        "added": 2,
        "taken": 2,
        "misses": 1,
        "expired": 0,
    }
    assert status["hit_rate"] == pytest.approx(2 / 3)
    assert status["waste"] == 0.0
    assert status["take_rate"] > 0
    store.reset_stats("ts-home")
    assert store.status("ts-home")["taken"] == 0

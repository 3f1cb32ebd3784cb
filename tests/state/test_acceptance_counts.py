"""Acceptance counts against a real Redis server: a report counts for its provider, method
and site, decayed on the server's clock; the table keeps the most reported sites; a
route change is said once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from captcha_tasks.state.acceptance import AcceptanceStore
from captcha_tasks.state.db import Db
from captcha_tasks.state.keys import Keys

pytestmark = pytest.mark.redis

HOUR = 3600.0


def make(redis_conn: Any, keys: Keys, sites: int = 100) -> AcceptanceStore:
    return AcceptanceStore(Db(redis_conn, keys), sites, HOUR)


def test_reports_count_by_provider_method_and_site(redis_conn: Any, keys: Keys) -> None:
    store = make(redis_conn, keys)
    for good in (True, True, True, False):
        store.report("primary", "turnstile", "shop.test", good)
    store.report("backup", "turnstile", "shop.test", False)
    store.report("primary", "hcaptcha", "shop.test", False)
    view = store.read("turnstile", "shop.test")
    assert set(view.acceptance) == {"primary", "backup"}
    primary = view.acceptance["primary"]
    assert (primary.good, primary.bad) == (pytest.approx(3, abs=0.01), pytest.approx(1, abs=0.01))
    assert primary.measure == pytest.approx(0.75, abs=0.01)
    assert view.acceptance["backup"].measure == 0.0
    assert store.read("hcaptcha", "shop.test").acceptance["primary"].bad == pytest.approx(1, 0.01)
    assert store.read("turnstile", "other.test").acceptance == {}
    assert store.reports() == {
        ("primary", "turnstile", True): 3,
        ("primary", "turnstile", False): 1,
        ("backup", "turnstile", False): 1,
        ("primary", "hcaptcha", False): 1,
    }


def test_v3_scores_are_averaged(redis_conn: Any, keys: Keys) -> None:
    store = make(redis_conn, keys)
    for score in (0.1, 0.3, 0.2):
        store.report("primary", "userrecaptcha", "v3.test", True, score=score)
    found = store.read("userrecaptcha", "v3.test").acceptance["primary"]
    assert found.measure == pytest.approx(0.2, abs=0.01)
    assert found.scores == pytest.approx(3, abs=0.01)


def test_counts_decay_on_the_servers_clock(
    redis_conn: Any, keys: Keys, move_clock: Callable[[float], None]
) -> None:
    store = AcceptanceStore(Db(redis_conn, keys), 100, 60)
    for _ in range(8):
        store.report("primary", "turnstile", "shop.test", False)

    def bad() -> float:
        return store.read("turnstile", "shop.test").acceptance["primary"].bad

    assert bad() > 4
    move_clock(150)  # two and a half half-lives
    assert 1.3 < bad() < 1.5  # 8 * 2 ** -2.5 = 1.41
    # a new report lands on the decayed counts
    store.report("primary", "turnstile", "shop.test", True)
    after = store.read("turnstile", "shop.test").acceptance["primary"]
    assert after.good == pytest.approx(1, abs=0.2)
    assert after.bad < 2
    assert after.measure is not None and after.measure > 1 / 3


def test_the_table_keeps_the_most_reported_sites(redis_conn: Any, keys: Keys) -> None:
    store = make(redis_conn, keys, sites=3)
    for site, reports in (("a.test", 5), ("b.test", 3), ("c.test", 1)):
        for _ in range(reports):
            assert store.report("primary", "turnstile", site, True) == 0
    # a new site takes the least reported one's place (and its count, plus its own)
    assert store.report("primary", "turnstile", "d.test", False) == 1
    assert store.read("turnstile", "c.test").acceptance == {}
    assert not redis_conn.exists(keys.acceptance("turnstile", "c.test"))
    busiest = store.busiest(10)
    assert busiest == [
        (keys.acceptance("turnstile", "a.test"), 5.0),
        (keys.acceptance("turnstile", "b.test"), 3.0),
        (keys.acceptance("turnstile", "d.test"), 2.0),
    ]
    assert redis_conn.zcard(keys.acceptance_sites()) == 3


def test_a_route_change_is_said_once(redis_conn: Any, keys: Keys) -> None:
    store = make(redis_conn, keys)
    # nothing reported: nothing recorded
    assert not store.routed("turnstile", "shop.test", "backup", "acceptance")
    store.report("primary", "turnstile", "shop.test", False)
    # a site that never left its order records nothing
    assert not store.routed("turnstile", "shop.test", "primary", "order")
    assert store.routed("turnstile", "shop.test", "backup", "acceptance")
    assert not store.routed("turnstile", "shop.test", "backup", "acceptance")
    view = store.read("turnstile", "shop.test")
    assert (view.route, view.why) == ("backup", "acceptance")
    # an exploring submit is counted, and is no route
    assert not store.routed("turnstile", "shop.test", "primary", "explore")
    assert store.read("turnstile", "shop.test").route == "backup"
    assert store.routed("turnstile", "shop.test", "primary", "order")
    assert set(store.read("turnstile", "shop.test").acceptance) == {"primary"}
    assert store.reroutes() == {"acceptance": 3, "explore": 1}


def test_the_exporter_serves_reports_ratios_and_reroutes(redis_conn: Any, keys: Keys) -> None:
    from captcha_tasks.metrics import StoreCollector
    from captcha_tasks.settings import RedisSettings, Settings
    from captcha_tasks.state import State

    settings = Settings(redis=RedisSettings(key_prefix=keys.prefix))
    state = State.build(settings, redis_conn)
    for good in (True, True, True, False):
        state.acceptance.report("captchaai", "turnstile", "shop.test", good)
    state.acceptance.routed("turnstile", "shop.test", "backup", "untried")
    found = {
        (metric.name, sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in StoreCollector(settings, state).collect()
        for sample in metric.samples
    }
    by = (("method", "turnstile"), ("provider", "captchaai"))
    assert found[("captcha_tasks_acceptance_ratio", "captcha_tasks_acceptance_ratio", by)] == 0.75
    bad = tuple(sorted((*by, ("verdict", "bad"))))
    assert (
        found[("captcha_tasks_acceptance_reports", "captcha_tasks_acceptance_reports_total", bad)]
        == 1.0
    )
    reroutes = {
        labels: value
        for (name, _, labels), value in found.items()
        if name == "captcha_tasks_reroutes"
    }
    assert reroutes == {
        (("reason", "acceptance"),): 0.0,
        (("reason", "explore"),): 0.0,
        (("reason", "untried"),): 1.0,
    }

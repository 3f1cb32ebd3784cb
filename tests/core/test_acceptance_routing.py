"""The acceptance router (captcha_tasks.core.acceptance) on its own: the site of a request,
decayed counts, the lower bound, and where a site's next submit goes.  No Redis, no
worker, the time passed in."""

from __future__ import annotations

import pytest

from captcha_tasks.core.acceptance import (
    Acceptance,
    AcceptancePolicy,
    Choice,
    choose,
    site_of,
)
from captcha_tasks.core.providers import ProviderSpec

pytestmark = pytest.mark.unit

T0 = 1_000_000.0
POLICY = AcceptancePolicy(min=0.75, min_reports=10, explore=0.05, half_life_s=3600.0)
PRIMARY = ProviderSpec("primary", "http://a.test", "k1", 10)
BACKUP = ProviderSpec("backup", "http://b.test", "k2", 10, role="fallback")
ORDER = (PRIMARY, BACKUP)
NO_EXPLORE = 0.99


def counts(good: int, bad: int, at: float = T0) -> Acceptance:
    found = Acceptance(at=at)
    for i in range(good + bad):
        found = found.reported(i < good, None, at, POLICY.half_life_s)
    return found


def scored(*scores: float, at: float = T0) -> Acceptance:
    found = Acceptance(at=at)
    for score in scores:
        found = found.reported(True, score, at, POLICY.half_life_s)
    return found


def test_a_site_is_the_host_with_its_sitekey() -> None:
    assert (
        site_of("https://Shop.Example.com:8443/login?x=1", "6Lc-key") == "shop.example.com#6Lc-key"
    )
    assert site_of("https://shop.example.com/other", None) == "shop.example.com"
    assert site_of(None, "6Lc-key") is None
    assert site_of("not a url", None) is None


def test_counts_halve_every_half_life() -> None:
    found = counts(8, 4).decayed(T0 + 2 * 3600, POLICY.half_life_s)
    assert found.good == pytest.approx(2.0)
    assert found.bad == pytest.approx(1.0)
    assert found.measure == pytest.approx(2 / 3)
    # a later report lands on the decayed counts
    after = found.reported(False, None, T0 + 2 * 3600, POLICY.half_life_s)
    assert (after.good, after.bad) == (pytest.approx(2.0), pytest.approx(2.0))


def test_the_lower_bound_grows_with_the_reports() -> None:
    few, many = counts(9, 1), counts(90, 10)
    assert few.measure == many.measure == pytest.approx(0.9)
    assert 0.0 < few.lower_bound() < many.lower_bound() < 0.9
    assert Acceptance().lower_bound() == 0.0
    assert Acceptance().measure is None


def test_a_site_with_few_reports_stays_in_order() -> None:
    acceptance = {"primary": counts(1, 8), "backup": counts(20, 0)}
    assert choose(ORDER, "turnstile", acceptance, NO_EXPLORE, POLICY) == Choice("primary", "order")


def test_the_minimum_of_reports_made_a_moment_ago_is_enough() -> None:
    # ten reports, seconds old: decayed a little below ten, still enough to judge
    poor = counts(3, 7).decayed(T0 + 5, POLICY.half_life_s)
    assert 9.95 < poor.reports < 10
    assert choose(ORDER, "turnstile", {"primary": poor}, NO_EXPLORE, POLICY) == Choice(
        "backup", "untried"
    )
    # nine are not
    assert choose(ORDER, "turnstile", {"primary": counts(2, 7)}, NO_EXPLORE, POLICY) == Choice(
        "primary", "order"
    )


def test_a_site_that_accepts_the_first_stays_there() -> None:
    acceptance = {"primary": counts(16, 4), "backup": counts(40, 0)}
    assert choose(ORDER, "turnstile", acceptance, NO_EXPLORE, POLICY) == Choice("primary", "order")


def test_a_poor_site_tries_an_untried_provider_then_goes_to_the_best_bound() -> None:
    poor = counts(4, 8)
    assert choose(ORDER, "turnstile", {"primary": poor}, NO_EXPLORE, POLICY) == Choice(
        "backup", "untried"
    )
    acceptance = {"primary": poor, "backup": counts(19, 1)}
    assert choose(ORDER, "turnstile", acceptance, NO_EXPLORE, POLICY) == Choice(
        "backup", "acceptance"
    )


def test_a_share_of_a_rerouted_site_explores_the_others() -> None:
    acceptance = {"primary": counts(4, 8), "backup": counts(19, 1)}
    draws = [i / 1000 for i in range(1000)]
    chosen = [choose(ORDER, "turnstile", acceptance, d, POLICY) for d in draws]
    explored = [c for c in chosen if c.reason == "explore"]
    assert len(explored) == 50
    assert {c.provider for c in explored} == {"primary"}


def test_a_provider_that_recovers_is_explored_back() -> None:
    # The primary was poor an hour ago; since then the exploring share sent it captchas
    # and the site accepted them: its old reports weigh half, the new ones outvote them.
    old = counts(4, 8, at=T0)
    recovered = old
    for _ in range(12):
        recovered = recovered.reported(True, None, T0 + 3600, POLICY.half_life_s)
    acceptance = {"primary": recovered, "backup": counts(19, 1, at=T0 + 3600)}
    assert choose(ORDER, "turnstile", {**acceptance, "primary": old}, NO_EXPLORE, POLICY) == (
        Choice("backup", "acceptance")
    )
    assert choose(ORDER, "turnstile", acceptance, NO_EXPLORE, POLICY) == Choice("primary", "order")


def test_a_method_the_better_provider_lacks_stays_at_the_first() -> None:
    images_only = ProviderSpec(
        "backup", "http://b.test", "k2", 10, role="fallback", methods=frozenset({"base64"})
    )
    acceptance = {"primary": counts(2, 10), "backup": counts(40, 0)}
    assert choose((PRIMARY, images_only), "turnstile", acceptance, 0.0, POLICY) == Choice(
        "primary", "order"
    )


def test_when_every_provider_is_poor_the_order_stands() -> None:
    acceptance = {"primary": counts(4, 8), "backup": counts(5, 9)}
    assert choose(ORDER, "turnstile", acceptance, NO_EXPLORE, POLICY) == Choice("primary", "order")
    # no exploring either: nothing was rerouted
    assert choose(ORDER, "turnstile", acceptance, 0.0, POLICY) == Choice("primary", "order")


def test_the_configured_order_breaks_ties() -> None:
    third = ProviderSpec("third", "http://c.test", "k3", 10, role="fallback")
    acceptance = {"primary": counts(2, 10), "backup": counts(20, 0), "third": counts(20, 0)}
    assert choose((PRIMARY, BACKUP, third), "turnstile", acceptance, NO_EXPLORE, POLICY) == (
        Choice("backup", "acceptance")
    )


def test_v3_routes_by_the_score() -> None:
    # Every v3 token is "accepted", but the site's scores say which provider's are useful.
    low = scored(*[0.1, 0.3] * 6)
    high = scored(*[0.9] * 12)
    assert low.measure == pytest.approx(0.2)
    assert (low.good, low.bad) == (12, 0)
    acceptance = {"primary": low, "backup": high}
    assert choose(ORDER, "userrecaptcha", acceptance, NO_EXPLORE, POLICY) == Choice(
        "backup", "acceptance"
    )
    assert choose(ORDER, "userrecaptcha", {"primary": high, "backup": low}, 0.0, POLICY) == (
        Choice("primary", "order")
    )

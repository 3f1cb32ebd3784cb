"""Lanes and tenants as values: CAPTCHAAI_TENANTS, the call-site checks, the defaults of
each entry point, and where a solve message is queued.  No Redis, no worker."""

from __future__ import annotations

import json

import pytest

from captcha_tasks.core.job import Job
from captcha_tasks.core.lanes import (
    DEFAULT_TENANT,
    LANES,
    Tenant,
    check_lane,
    check_tenant,
    default_lane,
    parse_tenants,
)
from captcha_tasks.core.steps import Route
from captcha_tasks.errors import ConfigurationError, ValidationError
from captcha_tasks.settings import CelerySettings, Settings

pytestmark = pytest.mark.unit

PAGE = "https://example.com/lanes"
ISSUE_EXAMPLE = (
    '{"shop": {"weight": 2}, "crawler": {"weight": 1, "max_threads": 10, "daily_captchas": 5000}}'
)


def test_the_issues_example_parses() -> None:
    tenants = parse_tenants(ISSUE_EXAMPLE)
    assert tenants == {
        "shop": Tenant("shop", weight=2.0),
        "crawler": Tenant("crawler", weight=1.0, max_threads=10, daily_captchas=5000),
    }
    assert json.loads(ISSUE_EXAMPLE) == {n: t.to_dict() for n, t in tenants.items()}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("[]", "expected a JSON object"),
        ('{"shop": 2}', "tenant 'shop' must be a JSON object"),
        ('{"shop": {"weight": 0}}', "tenant 'shop': weight must be > 0"),
        ('{"shop": {"weight": "2"}}', "tenant 'shop': weight must be a number"),
        ('{"shop": {"max_threads": 0}}', "tenant 'shop': max_threads must be at least 1"),
        ('{"shop": {"max_threads": 2.5}}', "tenant 'shop': max_threads must be a whole number"),
        ('{"shop": {"daily_captchas": -1}}', "daily_captchas must be at least 0"),
        ('{"shop": {"wieght": 2}}', "tenant 'shop' has unknown field(s) wieght"),
        ('{"a|b": {}}', "tenant name 'a|b' must be"),
        ('{"": {}}', "tenant name '' must be"),
    ],
)
def test_a_bad_tenant_is_named_with_its_field(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_tenants(raw)


def test_a_bad_captchaai_tenants_stops_start_up_naming_the_variable() -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"CAPTCHAAI_TENANTS has an invalid value: tenant .shop.: weight must be > 0",
    ):
        Settings.from_env({"CAPTCHAAI_TENANTS": '{"shop": {"weight": -1}}'})
    with pytest.raises(ConfigurationError, match="CAPTCHAAI_TENANTS has an invalid value"):
        Settings.from_env({"CAPTCHAAI_TENANTS": "{shop"})


def test_settings_know_the_declared_tenants_and_the_default_one() -> None:
    settings = Settings.from_env({"CAPTCHAAI_TENANTS": ISSUE_EXAMPLE})
    assert settings.tenants.names == ("crawler", "default", "shop")
    assert settings.tenants.get("crawler").daily_captchas == 5000
    assert settings.tenants.get(DEFAULT_TENANT) == Tenant(DEFAULT_TENANT)  # weight 1, no cap
    declared = Settings.from_env({"CAPTCHAAI_TENANTS": '{"default": {"weight": 3}}'})
    assert declared.tenants.get(DEFAULT_TENANT).weight == 3
    assert Settings().tenants.names == (DEFAULT_TENANT,)


def test_call_site_checks() -> None:
    assert [check_lane(lane) for lane in LANES] == list(LANES)
    with pytest.raises(ValidationError, match="unknown lane 'urgent': use one of interactive"):
        check_lane("urgent")
    tenants = parse_tenants(ISSUE_EXAMPLE)
    assert check_tenant("shop", tenants) == "shop"
    assert check_tenant(DEFAULT_TENANT, {}) == DEFAULT_TENANT
    with pytest.raises(ValidationError, match="unknown tenant 'shp': .* crawler, default, shop"):
        check_tenant("shp", tenants)


def test_each_entry_point_has_its_default_lane() -> None:
    assert default_lane(batch=False) == "interactive"  # solve.delay, aio.solve
    assert default_lane(batch=True) == "bulk"  # stream(), aio.stream, captcha-tasks batch


def test_each_lane_has_its_solve_queue() -> None:
    settings = Settings(celery=CelerySettings(queue_prefix="q"))
    assert settings.celery.solve_queues == ("q.solve", "q.solve.bulk", "q.solve.background")
    assert set(settings.celery.solve_queues) <= set(settings.celery.queues)
    assert settings.celery.solve_queue() == "q.solve"


def test_a_solve_message_names_its_route_and_the_request_is_what_is_left() -> None:
    kwargs: dict[str, object] = {
        "method": "turnstile",
        "lane": "bulk",
        "tenant": "shop",
        "_asked": 1_700_000_000.25,
    }
    route = Route.of(kwargs, batch=False)
    assert route == Route("bulk", "shop", 1_700_000_000.25)
    assert kwargs == {"method": "turnstile"}
    # a message from before lanes: its call site's default
    assert Route.of({}, batch=True) == Route("bulk", None, None)
    with pytest.raises(ValidationError, match="unknown lane"):
        Route.of({"lane": "urgent"}, batch=False).check()
    with pytest.raises(ValidationError, match="cannot name a tenant"):
        Route.of({"tenant": "a|b"}, batch=False).check()
    Route.of({"tenant": "declared-by-the-caller-only"}, batch=False).check()


def test_a_job_carries_its_lane_and_tenant_and_old_jobs_still_read() -> None:
    old = {
        "solve_id": "s1",
        "request": {
            "method": "turnstile",
            "sitekey": "k",
            "pageurl": "https://e.com",
            "params": {},
        },
        "started": 1.0,
        "deadline": 2.0,
        "pool": None,
        "batch": None,
    }
    job = Job.from_dict(old)
    assert (job.lane, job.tenant, job.lane_name, job.tenant_name) == (
        None,
        None,
        "interactive",
        "default",
    )
    assert Job.from_dict({**old, "pool": "login"}).lane_name == "background"
    assert set(job.to_dict()) == set(old) | {"attempt", "transport_errors", "resubmits"}
    routed = Job.from_dict({**old, "lane": "bulk", "tenant": "shop", "asked": 0.5})
    assert (routed.lane_name, routed.tenant_name, routed.asked) == ("bulk", "shop", 0.5)
    assert Job.from_json(routed.to_json()) == routed

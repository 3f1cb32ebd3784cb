"""A pooled proxy the API reports bad is quarantined and the captcha solved with another."""

from __future__ import annotations

from typing import Any

import pytest

from captcha_tasks import errors, solve
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.toolkit.proxies import ProxyPool

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("worker", "clean_state")]

PAGE = "https://example.com/proxy"
BAD = "user:secret@bad-proxy.test:3128"
GOOD = "user:secret@good-proxy.test:3128"


def test_bad_pool_proxy_is_replaced(sandbox: Any, settings: Any) -> None:
    proxies = ProxyPool.from_settings(settings)  # the pool the workers take proxies from
    proxies.add(BAD)
    res = solve.delay(method="turnstile", sitekey="k", pageurl=PAGE, proxy="pool")
    # the only proxy fails at the provider and goes to quarantine...
    wait_until(lambda: proxies.quarantined(), 20, what="the bad proxy's quarantine")
    assert [proxies.mask(p) for p in proxies.quarantined()] == [proxies.mask(BAD)]
    # ...the solve waits for a free proxy, and finishes with the good one
    proxies.add(GOOD)
    result = res.get(timeout=30)
    assert sandbox.verify(result["token"])["success"] is True
    assert sandbox.stats()["submits"] == 2


def test_caller_proxy_error_is_fatal(sandbox: Any) -> None:
    with pytest.raises(errors.ProxyError) as info:
        solve.delay(method="turnstile", sitekey="k", pageurl=PAGE, proxy=BAD).get(timeout=30)
    assert info.value.code == "ERROR_PROXY_CONNECTION_FAILED"
    assert sandbox.stats()["submits"] == 1
    assert "secret" not in str(info.value)

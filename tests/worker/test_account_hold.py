"""An HTTP 429 holds every request of the account: housekeeping's balance check too (it
asked ``getbalance`` while the account was held, which the 429 test saw on a loaded run)."""

from __future__ import annotations

from typing import Any

import pytest

from captcha_tasks.worker import housekeeping

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("clean_state")]


def test_the_balance_check_waits_out_a_429_hold(app: Any, sandbox: Any) -> None:
    runtime = app.runtime()
    limiter = runtime.state.provider(None).limiter
    asked = sandbox.stats()["res_php_requests"]
    assert limiter.held_s() == 0
    limiter.pause(30)
    assert 29 < limiter.held_s() <= 30
    found = housekeeping.check_providers(runtime.runner)
    assert found[runtime.settings.providers.primary.name] == {"error": "ERROR_RATE_LIMITED"}
    assert sandbox.stats()["res_php_requests"] == asked  # nothing asked while held
    runtime.state.redis.hdel(runtime.state.keys.rate("hourly"), "pause")  # the hold is over
    assert limiter.held_s() == 0
    found = housekeeping.check_providers(runtime.runner)
    assert "balance" in found[runtime.settings.providers.primary.name]
    assert sandbox.stats()["res_php_requests"] > asked

"""Provider health (captcha_tasks.core.health) on its own: what a request's outcome asks
of its provider's circuit and account, decided from the circuit as read."""

from __future__ import annotations

import pytest

from captcha_tasks import errors
from captcha_tasks.core import health
from captcha_tasks.core.health import Circuit, ClearFailures, CountFailure

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (errors.TransportError("timed out"), "soft"),
        (errors.from_api_code("ERROR_ZERO_BALANCE"), "balance"),
        (errors.from_api_code("ERROR_WRONG_USER_KEY"), "key"),
        (errors.from_api_code("ERROR_KEY_DOES_NOT_EXIST"), "key"),
        (errors.from_api_code("ERROR_TOO_MUCH_REQUESTS"), None),
        (errors.from_api_code("ERROR_DOMAIN_NOT_ALLOWED"), None),
        (errors.from_api_code("ERROR_CAPTCHA_UNSOLVABLE"), None),
        (errors.from_api_code("ERROR_NO_SLOT_AVAILABLE"), None),
    ],
)
def test_what_an_error_says_about_its_provider(error: errors.CaptchaTasksError, kind: str) -> None:
    assert health.failure_kind(error) == kind


def test_an_answer_costs_no_write_unless_failures_were_counted() -> None:
    assert health.on_request(Circuit("main"), None) is None
    assert health.on_request(Circuit("main", failures=2), None) == ClearFailures()
    # an error of the captcha's own is an answer too: the provider is alive
    unsolvable = errors.from_api_code("ERROR_CAPTCHA_UNSOLVABLE")
    assert health.on_request(Circuit("main", failures=1), unsolvable) == ClearFailures()
    assert health.on_request(Circuit("main"), unsolvable) is None


def test_a_failure_is_counted_with_what_it_says_of_the_provider() -> None:
    timeout = errors.TransportError("timed out")
    assert health.on_request(Circuit("main"), timeout) == CountFailure(timeout.code, "soft")
    empty = errors.from_api_code("ERROR_ZERO_BALANCE")
    on_open = Circuit("main", open=True, why="soft", failures=5)
    assert health.on_request(on_open, empty) == CountFailure("ERROR_ZERO_BALANCE", "balance")


def test_a_429_holds_the_whole_account_for_its_retry_after_and_nothing_else_does() -> None:
    assert health.account_hold(errors.RateLimited("HTTP 429", retry_after=12.5)) == 12.5
    assert health.account_hold(errors.RateLimited("HTTP 429", retry_after=-1.0)) == 0.0
    assert health.account_hold(errors.TransportError("timed out")) is None
    assert health.account_hold(errors.from_api_code("ERROR_NO_SLOT_AVAILABLE")) is None


def test_a_probe_closes_a_circuit_on_money_or_on_any_answer() -> None:
    empty = Circuit("main", open=True, why="balance")
    assert not health.back_in_rotation(empty, 0.0)
    assert health.back_in_rotation(empty, 1.5)
    silent = Circuit("main", open=True, why="soft")
    assert health.back_in_rotation(silent, 0.0)

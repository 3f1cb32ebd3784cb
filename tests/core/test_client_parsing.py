"""Table tests of reply parsing over recorded response bodies (no network)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from captcha_tasks import errors
from captcha_tasks.providers.inphp import (
    DEFAULT_RETRY_AFTER,
    MAX_RETRY_AFTER,
    NOT_READY_TEXT,
    parse_reply,
    retry_after,
)

pytestmark = pytest.mark.unit

CLOUDFLARE_502 = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    "<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>cloudflare</center>\r\n"
    "</body>\r\n</html>"
)

OK_CASES = [
    ('{"status":1,"request":"73548291"}', 200, True, "73548291"),
    ("OK|73548291", 200, True, "73548291"),
    ('{"status":0,"request":"CAPCHA_NOT_READY"}', 200, False, NOT_READY_TEXT),
    ("CAPCHA_NOT_READY", 200, False, NOT_READY_TEXT),
    (
        '{"status":0,"request":"ERROR_WRONG_USER_KEY","error_text":"bad key"}',
        200,
        False,
        "ERROR_WRONG_USER_KEY",
    ),
    ("ERROR_ZERO_BALANCE", 200, False, "ERROR_ZERO_BALANCE"),
    ("OK|a|b c", 200, True, "a|b c"),
    (
        '{"status":1,"request":{"geetest_challenge":"c","geetest_validate":"v",'
        '"geetest_seccode":"s"}}',
        200,
        True,
        {"geetest_challenge": "c", "geetest_validate": "v", "geetest_seccode": "s"},
    ),
    ("1.2345", 200, True, "1.2345"),
    ("OK_REPORT_RECORDED", 200, True, "OK_REPORT_RECORDED"),
    ("ERROR_NO_SLOT_AVAILABLE", 429, False, "ERROR_NO_SLOT_AVAILABLE"),
]


@pytest.mark.parametrize(("body", "status", "ok", "value"), OK_CASES)
def test_parse_reply_values(body: str, status: int, ok: bool, value: object) -> None:
    reply = parse_reply(status, body)
    assert reply.ok is ok
    assert reply.request == value


TRANSIENT_CASES = [
    ("", 200),
    ("   \n", 200),
    (CLOUDFLARE_502, 502),
    (CLOUDFLARE_502, 200),
    ("<!DOCTYPE html><html><body>maintenance</body></html>", 200),
    ('{"status":1,', 200),
    ('{"request":"x"}', 200),
    ("Internal Server Error", 500),
    ("Too Many Requests", 429),
]


@pytest.mark.parametrize(("body", "status"), TRANSIENT_CASES)
def test_parse_reply_transient(body: str, status: int) -> None:
    with pytest.raises(errors.TransportError) as info:
        parse_reply(status, body, "res.php")
    assert isinstance(info.value, errors.RetryableError)
    assert "res.php" in str(info.value)


CODES = [
    ("ERROR_NO_SLOT_AVAILABLE", errors.NoSlotError, errors.RetryableError),
    ("ERROR_ZERO_BALANCE", errors.ZeroBalance, errors.FatalError),
    ("ERROR_SERVER_ERROR", errors.ServerError, errors.RetryableError),
    ("MAX_USER_TURN", errors.ServerError, errors.RetryableError),
    ("ERROR_CAPTCHA_UNSOLVABLE", errors.UnsolvableError, errors.ResubmitError),
    ("ERROR_WRONG_USER_KEY", errors.AuthError, errors.FatalError),
    ("ERROR_KEY_DOES_NOT_EXIST", errors.AuthError, errors.FatalError),
    ("IP_BANNED", errors.AuthError, errors.FatalError),
    ("ERROR_GOOGLEKEY", errors.BadRequestError, errors.FatalError),
    ("ERROR_PAGEURL", errors.BadRequestError, errors.FatalError),
    ("ERROR_BAD_PARAMETERS", errors.BadRequestError, errors.FatalError),
    ("ERROR_PROXY_CONNECTION_FAILED", errors.ProxyError, errors.FatalError),
    ("ERROR_BAD_PROXY", errors.ProxyError, errors.FatalError),
    ("ERROR_TOO_MUCH_REQUESTS", errors.RateLimited, errors.RetryableError),
    ("ERROR_BAD_DUPLICATES", errors.UnsolvableError, errors.ResubmitError),
    ("ERROR_CAPTCHAIMAGE_BLOCKED", errors.BadRequestError, errors.FatalError),
    ("ERROR_BAD_TOKEN_OR_PAGEURL", errors.BadRequestError, errors.FatalError),
    ("ERROR_WRONG_ID_FORMAT", errors.BadRequestError, errors.FatalError),
    ("ERROR_DOMAIN_NOT_ALLOWED", errors.BadRequestError, errors.FatalError),
    ("ERROR_SOMETHING_NEW", errors.UnknownAPIError, errors.FatalError),
]

#: The codes CaptchaAI documents that were once unknown (and so fatal), with what their
#: hint must tell the caller.
CAPTCHAAI_CODES = {
    "ERROR_TOO_MUCH_REQUESTS": "slow down",
    "ERROR_BAD_DUPLICATES": "a new captcha is submitted",
    "ERROR_CAPTCHAIMAGE_BLOCKED": "send another captcha image",
    "ERROR_BAD_TOKEN_OR_PAGEURL": "read fresh parameters",
    "ERROR_WRONG_ID_FORMAT": "digits only",
    "ERROR_DOMAIN_NOT_ALLOWED": "domain",
}


@pytest.mark.parametrize(("code", "cls", "family"), CODES)
def test_error_tree(code: str, cls: type, family: type) -> None:
    exc = errors.from_api_code(code, "42")
    assert type(exc) is cls
    assert isinstance(exc, family)
    assert exc.code == code
    assert exc.captcha_id == "42"
    assert code in str(exc)


def test_exceptions_rebuild_from_args() -> None:
    # Celery's JSON result backend rebuilds exceptions as cls(*exc.args).
    exc = errors.from_api_code("ERROR_SOMETHING_NEW", "7", "the message")
    again = type(exc)(*exc.args)
    assert (again.code, again.captcha_id, again.message) == (exc.code, "7", "the message")


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after("7") == 7.0
    assert retry_after(None) == retry_after("soon") == DEFAULT_RETRY_AFTER
    assert retry_after("99999") == MAX_RETRY_AFTER
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 <= retry_after(later) <= 30


@pytest.mark.parametrize("code", ["ERROR_WRONG_USER_KEY", "ERROR_KEY_DOES_NOT_EXIST"])
def test_wrong_key_says_what_to_check(code: str) -> None:
    exc = errors.from_api_code(code)
    assert str(exc).startswith(f"{code}: ")
    assert "check CAPTCHAAI_API_KEY" in str(exc)


def test_captchaai_reply_fields_are_kept() -> None:
    # reCAPTCHA Enterprise and the Cloudflare challenge: the answer in ``result``
    reply = parse_reply(200, '{"status":1,"result":"cf-clearance","user_agent":"Mozilla/5.0 X"}')
    assert reply.ok and reply.request is None
    assert reply.fields == {"result": "cf-clearance", "user_agent": "Mozilla/5.0 X"}
    # threadsinfo: the counts as top-level fields
    info = parse_reply(200, '{"status":1,"threads":10,"working_threads":3}')
    assert info.fields == {"threads": 10, "working_threads": 3}
    assert parse_reply(200, '{"status":1,"request":"7"}').fields == {}


@pytest.mark.parametrize(("code", "says"), sorted(CAPTCHAAI_CODES.items()))
def test_each_captchaai_code_is_known_and_says_what_to_do(code: str, says: str) -> None:
    assert code in errors.codes()
    exc = errors.from_api_code(code, "7")
    assert not isinstance(exc, errors.UnknownAPIError)
    assert str(exc).startswith(f"{code}: ") and says in str(exc)


@pytest.mark.parametrize("code", sorted(CAPTCHAAI_CODES))
@pytest.mark.parametrize("form", ["json", "text"])
def test_a_reply_with_each_captchaai_code_parses_to_it(code: str, form: str) -> None:
    body = f'{{"status":0,"request":"{code}","error_text":"x"}}' if form == "json" else code
    reply = parse_reply(200, body, "in.php")
    assert (reply.ok, reply.request) == (False, code)


def test_too_many_requests_holds_the_account_a_few_seconds_without_spending_a_retry() -> None:
    exc = errors.from_api_code("ERROR_TOO_MUCH_REQUESTS")
    assert isinstance(exc, errors.RateLimited)
    # CaptchaAI: "retry after 3-10 s"
    assert 3.0 <= exc.retry_after == DEFAULT_RETRY_AFTER <= 10.0


def test_a_rate_limit_rebuilds_with_its_wait() -> None:
    # Celery's JSON backend and the outcome in Redis rebuild it from __reduce__
    exc = errors.RateLimited("in.php: HTTP 429, retry after 42 s", retry_after=42.0)
    cls, args = exc.__reduce__()
    again = cls(*args)
    assert type(again) is errors.RateLimited and again.retry_after == 42.0
    assert (again.code, again.message) == ("ERROR_RATE_LIMITED", exc.message)


def test_a_key_that_does_not_exist_may_be_an_account_without_threads() -> None:
    hint = str(errors.from_api_code("ERROR_KEY_DOES_NOT_EXIST"))
    assert "check CAPTCHAAI_API_KEY" in hint
    assert "no threads" in hint and "trial" in hint and "subscribe" in hint

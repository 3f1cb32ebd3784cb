"""The JSON dialects as values and the JSON client's pure reply parser (no socket)."""

from __future__ import annotations

import pytest

from captcha_tasks import errors
from captcha_tasks.core.answers import NOT_READY, Answer
from captcha_tasks.core.dialects import ANTICAPTCHA, CAPMONSTER, CAPSOLVER, DIALECTS, build_task
from captcha_tasks.methods import build_request
from captcha_tasks.providers.jsonapi import parse_body, parse_task_reply

pytestmark = pytest.mark.unit

#: What the caller does next, by the class each code must become.
EXPECTED = {
    "ERROR_KEY_DOES_NOT_EXIST": errors.AuthError,
    "ERROR_ZERO_BALANCE": errors.ZeroBalance,
    "ERROR_NO_SLOT_AVAILABLE": errors.NoSlotError,
    "ERROR_CAPTCHA_UNSOLVABLE": errors.UnsolvableError,
    "ERROR_TASK_ABSENT": errors.BadRequestError,
    "ERROR_TASK_NOT_SUPPORTED": errors.BadRequestError,
    "ERROR_NO_SUCH_CAPCHA_ID": errors.BadRequestError,
    "ERROR_WRONG_CAPTCHA_ID": errors.BadRequestError,
    "ERROR_IP_BLOCKED": errors.AuthError,
    "ERROR_PROXY_CONNECT_REFUSED": errors.ProxyError,
    "ERROR_PROXY_BANNED": errors.ProxyError,
    "ERROR_TOO_MUCH_REQUESTS": errors.RateLimited,
}


@pytest.mark.parametrize("dialect", list(DIALECTS.values()), ids=list(DIALECTS))
def test_every_error_code_of_the_table_is_typed(dialect) -> None:  # type: ignore[no-untyped-def]
    for code in dialect.errors:
        value = parse_task_reply(dialect, {"errorId": 1, "errorCode": code}, "7")
        assert isinstance(value, errors.CaptchaTasksError), code
        assert not isinstance(value, errors.UnknownAPIError), code
        assert value.captcha_id == "7"
    for code, cls in EXPECTED.items():
        assert isinstance(parse_task_reply(dialect, {"errorId": 1, "errorCode": code}), cls), code


def test_an_unknown_code_is_typed_and_kept() -> None:
    value = parse_task_reply(ANTICAPTCHA, {"errorId": 1, "errorCode": "ERROR_NEW_THING"})
    assert isinstance(value, errors.UnknownAPIError) and value.code == "ERROR_NEW_THING"


def test_not_ready_is_a_value_and_capsolver_idle_is_not_ready() -> None:
    assert parse_task_reply(CAPMONSTER, {"errorId": 0, "status": "processing"}) is NOT_READY
    assert parse_task_reply(CAPSOLVER, {"errorId": 0, "status": "idle"}) is NOT_READY
    assert isinstance(
        parse_task_reply(ANTICAPTCHA, {"errorId": 0, "status": "idle"}), errors.TransportError
    )


def test_answers_from_each_solution_field() -> None:
    ready = {"errorId": 0, "status": "ready"}
    token = parse_task_reply(
        ANTICAPTCHA, {**ready, "solution": {"gRecaptchaResponse": "tok", "userAgent": "UA"}}
    )
    assert token == Answer("tok", "UA")
    assert parse_task_reply(CAPSOLVER, {**ready, "solution": {"token": "t"}}) == Answer("t")
    assert parse_task_reply(CAPMONSTER, {**ready, "solution": {"text": "abc"}}) == Answer("abc")
    geetest = parse_task_reply(
        CAPMONSTER, {**ready, "solution": {"challenge": "c", "validate": "v"}}
    )
    assert geetest == Answer({"challenge": "c", "validate": "v"})


def test_bodies_that_are_not_replies_are_transport_errors() -> None:
    for status, body in ((502, "{}"), (200, "<html>"), (200, '{"status": 1}')):
        with pytest.raises(errors.TransportError):
            parse_body(status, body, "getTaskResult")


def test_task_types_per_dialect_and_back() -> None:
    request = build_request("userrecaptcha", sitekey="k" * 40, pageurl="https://example.com/")
    assert build_task(ANTICAPTCHA, request)["type"] == "RecaptchaV2TaskProxyless"
    assert build_task(CAPSOLVER, request)["type"] == "ReCaptchaV2TaskProxyLess"
    assert build_task(CAPMONSTER, request)["type"] == "RecaptchaV2Task"
    for dialect in DIALECTS.values():
        for key, types in dialect.task_types.items():
            for task_type in filter(None, (types.proxyless, types.proxied)):
                assert dialect.key_of({"type": task_type, **types.fixed}) == key
                assert dialect.method_of(task_type) == key.partition(":")[0]


def test_a_proxy_task_carries_the_proxy_fields() -> None:
    request = build_request(
        "userrecaptcha",
        sitekey="k" * 40,
        pageurl="https://example.com/",
        proxy="user:pw@10.0.0.1:3128",
        proxytype="HTTP",
    )
    task = build_task(ANTICAPTCHA, request)
    assert task["type"] == "RecaptchaV2Task"
    assert (task["proxyType"], task["proxyAddress"], task["proxyPort"]) == (
        "http",
        "10.0.0.1",
        3128,
    )
    assert (task["proxyLogin"], task["proxyPassword"]) == ("user", "pw")


def test_a_method_the_dialect_lacks_is_refused() -> None:
    request = build_request(
        "turnstile", sitekey="0x4AAAA", pageurl="https://e.com/", proxy="h:1", proxytype="HTTP"
    )
    with pytest.raises(errors.ValidationError, match="capsolver has no task type"):
        build_task(CAPSOLVER, request)


def test_a_malformed_proxy_is_refused_without_showing_it() -> None:
    from captcha_tasks.core.dialects import proxy_fields

    with pytest.raises(errors.ValidationError) as info:
        proxy_fields("user:s3cret-pass@no-port-here", "HTTP")
    assert "s3cret-pass" not in str(info.value)
    assert proxy_fields("10.0.0.1:3128", "SOCKS5") == {
        "proxyType": "socks5",
        "proxyAddress": "10.0.0.1",
        "proxyPort": 3128,
    }


def test_a_clients_per_task_state_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from captcha_tasks.providers import jsonapi

    monkeypatch.setattr(jsonapi, "TASKS_KEPT", 3)
    kept: dict[str, int] = {}
    for n in range(5):
        jsonapi._remember(kept, str(n), n)
    jsonapi._remember(kept, "2", 20)  # remembered again: the newest
    assert list(kept.items()) == [("3", 3), ("4", 4), ("2", 20)]

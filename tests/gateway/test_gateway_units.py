"""The gateway's pure parts: reading the two faces' fields into ``solve``'s arguments, the
task-type table, tenants by key and their rates, bodies, the counters' layout, and the
error codes a failure is answered with.  No socket."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from image_files import png

from captcha_tasks import errors
from captcha_tasks.core.lanes import Tenant, parse_tenants
from captcha_tasks.gateway import inphp, tasktypes
from captcha_tasks.gateway.forms import Unreadable, read_fields, read_json
from captcha_tasks.gateway.service import provider_code
from captcha_tasks.gateway.tenants import TenantKeys
from captcha_tasks.serving import Request
from captcha_tasks.settings import Settings, TenantSettings
from captcha_tasks.state.gateway import LATENCY_BUCKETS, Ticket, _tabulate
from captcha_tasks.worker.callsite import normalize_solve_args

pytestmark = pytest.mark.unit

PAGE = "https://example.com/p"


def request(body: bytes = b"", content_type: str = "", query: str = "") -> Request:
    headers = ((b"content-type", content_type.encode()),) if content_type else ()
    return Request("POST", "/in.php", query, headers, body, len(body), "127.0.0.1")


# -- in.php fields ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"method": "userrecaptcha", "googlekey": "6Le", "pageurl": PAGE, "version": "v2"},
            {"method": "userrecaptcha", "sitekey": "6Le", "pageurl": PAGE, "version": "v2"},
        ),
        (
            {"method": "geetest", "gt": "g", "challenge": "c", "pageurl": PAGE, "apiServer": "a"},
            {
                "method": "geetest",
                "sitekey": "g",
                "challenge": "c",
                "pageurl": PAGE,
                "api_server": "a",
            },
        ),
        (
            {"method": "lemin", "captcha_id": "L", "div_id": "d", "pageurl": PAGE},
            {"method": "lemin", "sitekey": "L", "div_id": "d", "pageurl": PAGE},
        ),
        (
            {"method": "turnstile", "sitekey": "0x4", "pageurl": PAGE, "key": "k", "json": "1"},
            {"method": "turnstile", "sitekey": "0x4", "pageurl": PAGE},
        ),
        (
            {"method": "base64", "body": "QUJD", "grid_size": "3x3", "instructions": "cars"},
            {"method": "grid", "body": "QUJD", "grid_size": "3x3", "instructions": "cars"},
        ),
    ],
)
def test_in_php_fields_become_solve_arguments(
    fields: dict[str, str], expected: dict[str, Any]
) -> None:
    assert inphp.submit_fields(fields, {}) == expected


def test_a_file_part_and_bls_images() -> None:
    image = png(2048)
    kwargs = inphp.submit_fields({"method": "post", "numeric": "1"}, {"file": image})
    assert kwargs == {"method": "base64", "numeric": "1", "body": base64.b64encode(image).decode()}
    cells = {f"image_base64_{n}": f"img{n}" for n in range(1, 10)}
    bls = inphp.submit_fields({"method": "bls", "instructions": "x", **cells}, {})
    assert bls["images"] == [f"img{n}" for n in range(1, 10)]
    with pytest.raises(inphp.Refused, match="ERROR_ZERO_CAPTCHA_FILESIZE"):
        inphp.submit_fields({"method": "post"}, {})


def test_the_tenant_is_the_keys_and_a_method_is_required() -> None:
    with pytest.raises(inphp.Refused) as refused:
        inphp.submit_fields({"method": "turnstile", "tenant": "other"}, {})
    assert refused.value.code == "ERROR_BAD_PARAMETERS"
    with pytest.raises(inphp.Refused, match="ERROR_BAD_PARAMETERS"):
        inphp.submit_fields({"sitekey": "x"}, {})


def _refusal(kwargs: dict[str, Any]) -> errors.ValidationError:
    with pytest.raises(errors.ValidationError) as caught:
        normalize_solve_args((), kwargs, Settings())
    return caught.value


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"method": "userrecaptcha", "pageurl": PAGE}, "ERROR_GOOGLEKEY"),
        ({"method": "turnstile", "sitekey": "x", "pageurl": "ftp://x"}, "ERROR_PAGEURL"),
        (
            {"method": "base64", "body": base64.b64encode(b"x" * 10).decode()},
            "ERROR_ZERO_CAPTCHA_FILESIZE",
        ),
        (
            {"method": "base64", "body": base64.b64encode(b"x" * 2_000_000).decode()},
            "ERROR_TOO_BIG_CAPTCHA_FILESIZE",
        ),
        (
            {"method": "base64", "body": base64.b64encode(b"x" * 2000).decode()},
            "ERROR_IMAGE_TYPE_NOT_SUPPORTED",
        ),
        (
            {"method": "turnstile", "sitekey": "x", "pageurl": PAGE, "bogus": 1},
            "ERROR_BAD_PARAMETERS",
        ),
        ({"method": "nope"}, "ERROR_BAD_PARAMETERS"),
    ],
)
def test_what_solve_delay_refuses_has_the_providers_code(kwargs: dict[str, Any], code: str) -> None:
    assert inphp.validation_code(_refusal(kwargs), kwargs["method"]) == code


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ("ERROR_CAPTCHA_UNSOLVABLE", "ERROR_CAPTCHA_UNSOLVABLE"),
        ("ERROR_BAD_PROXY", "ERROR_BAD_PROXY"),
        ("ERROR_SOLVE_TIMEOUT", "ERROR_CAPTCHA_UNSOLVABLE"),
        ("ERROR_RETRIES_EXHAUSTED", "ERROR_CAPTCHA_UNSOLVABLE"),
        ("ERROR_REVOKED", "ERROR_CAPTCHA_UNSOLVABLE"),
        ("ERROR_INTERNAL", "ERROR_CAPTCHA_UNSOLVABLE"),
        ("ERROR_BUDGET_EXCEEDED", "ERROR_ZERO_BALANCE"),
        # the account's own key refused upstream is not the tenant's key
        ("ERROR_WRONG_USER_KEY", "ERROR_SERVER_ERROR"),
        ("ERROR_KEY_DOES_NOT_EXIST", "ERROR_SERVER_ERROR"),
    ],
)
def test_a_failed_solve_is_answered_with_a_providers_code(ours: str, theirs: str) -> None:
    assert provider_code(ours) == theirs


# -- the JSON face's task types ------------------------------------------------------------


def test_task_types_become_solve_arguments() -> None:
    v3 = tasktypes.solve_kwargs(
        {
            "type": "RecaptchaV3TaskProxyless",
            "websiteURL": PAGE,
            "websiteKey": "6Le",
            "minScore": 0.7,
            "pageAction": "login",
        }
    )
    assert v3 == {
        "method": "userrecaptcha",
        "version": "v3",
        "pageurl": PAGE,
        "sitekey": "6Le",
        "min_score": 0.7,
        "action": "login",
    }
    proxied = tasktypes.solve_kwargs(
        {
            "type": "RecaptchaV2Task",
            "websiteURL": PAGE,
            "websiteKey": "6Le",
            "isInvisible": True,
            "proxyType": "http",
            "proxyAddress": "10.0.0.1",
            "proxyPort": 3128,
            "proxyLogin": "u",
            "proxyPassword": "p",
        }
    )
    assert proxied["invisible"] == 1
    assert (proxied["proxy"], proxied["proxytype"]) == ("u:p@10.0.0.1:3128", "HTTP")
    image = tasktypes.solve_kwargs({"type": "ImageToTextTask", "body": "QUJD", "numeric": 1})
    assert image == {"method": "base64", "body": "QUJD", "numeric": 1}
    # every type's arguments pass solve.delay's own checks
    for name, kind in tasktypes.TASK_TYPES.items():
        assert kind.method in {
            "userrecaptcha",
            "turnstile",
            "geetest",
            "base64",
            "friendly_captcha",
            "lemin",
            "cloudflare_challenge",
            "captchafox",
        }, name


@pytest.mark.parametrize(
    ("task", "code"),
    [
        (None, "ERROR_TASK_ABSENT"),
        ("TurnstileTask", "ERROR_TASK_ABSENT"),
        ({"type": "FunCaptchaTask"}, "ERROR_TASK_NOT_SUPPORTED"),
        ({}, "ERROR_TASK_NOT_SUPPORTED"),
        (
            {"type": "TurnstileTask", "websiteURL": PAGE, "websiteKy": "x"},
            "ERROR_INVALID_TASK_DATA",
        ),
    ],
)
def test_tasks_the_table_cannot_read(task: Any, code: str) -> None:
    with pytest.raises(tasktypes.BadTask) as bad:
        tasktypes.solve_kwargs(task)
    assert bad.value.code == code


def test_solutions_by_method() -> None:
    assert tasktypes.solution("userrecaptcha", "t", None) == {"gRecaptchaResponse": "t"}
    assert tasktypes.solution("turnstile", "t", "UA") == {"token": "t", "userAgent": "UA"}
    assert tasktypes.solution("base64", "abc", None) == {"text": "abc"}
    geetest = {"geetest_challenge": "c", "geetest_validate": "v", "geetest_seccode": "s"}
    assert tasktypes.solution("geetest", geetest, None) == {
        "challenge": "c",
        "validate": "v",
        "seccode": "s",
    }


# -- tenants are keys ------------------------------------------------------------------------


def settings_with(tenants: dict[str, Any]) -> Settings:
    return Settings(tenants=TenantSettings(parse_tenants(json.dumps(tenants))))


def test_tenants_by_key() -> None:
    keys = TenantKeys.from_settings(
        settings_with({"a": {"key_env": "KA"}, "b": {"key_env": "KB"}, "c": {}}),
        {"KA": "a" * 32, "KB": " " + "b" * 32 + "\n"},
    )
    assert [t.name for t in keys.tenants] == ["a", "b"]
    assert keys.who("a" * 32).name == "a"  # type: ignore[union-attr]
    assert keys.who("b" * 32).name == "b"  # type: ignore[union-attr]
    assert keys.who("a" * 31) is None and keys.who("") is None and keys.who("ä" * 32) is None


@pytest.mark.parametrize(
    ("tenants", "environ", "named"),
    [
        ({"a": {"key_env": "KA"}}, {}, "KA"),
        ({"a": {"key_env": "KA"}}, {"KA": "short"}, "KA"),
        ({"a": {"key_env": "KA"}, "b": {"key_env": "KB"}}, {"KA": "k" * 20, "KB": "k" * 20}, "KB"),
        ({"a": {}}, {}, "key_env"),
    ],
)
def test_bad_keys_stop_the_gateway_naming_the_variable(
    tenants: dict[str, Any], environ: dict[str, str], named: str
) -> None:
    with pytest.raises(errors.ConfigurationError, match=named) as stopped:
        TenantKeys.from_settings(settings_with(tenants), environ)
    for value in environ.values():
        assert value not in str(stopped.value)


def test_request_rates_and_wrong_key_strikes() -> None:
    keys = TenantKeys.from_settings(
        settings_with({"a": {"key_env": "KA", "requests_per_s": 3}}), {"KA": "a" * 32}
    )
    tenant = keys.tenants[0]
    assert [keys.allow(tenant) for _ in range(4)] == [True, True, True, False]
    assert not keys.guessing("203.0.113.9")
    for _ in range(20):
        keys.wrong_key("203.0.113.9")
    assert keys.guessing("203.0.113.9") and not keys.guessing("203.0.113.10")


def test_the_tenant_fields_of_the_gateway_are_checked() -> None:
    [tenant] = parse_tenants('{"t": {"key_env": "GW_T", "requests_per_s": 5}}').values()
    assert tenant == Tenant("t", key_env="GW_T", requests_per_s=5.0)
    assert tenant.to_dict() == {"weight": 1.0, "key_env": "GW_T", "requests_per_s": 5.0}
    [hooked] = parse_tenants('{"h": {"callback_hosts": ["Hooks.Example", "10.0.0.9:81"]}}').values()
    assert hooked.callback_hosts == ("hooks.example", "10.0.0.9:81")
    assert parse_tenants(json.dumps({"h": hooked.to_dict()}))["h"] == hooked
    for bad, why in [
        ('{"t": {"key_env": "my secret key"}}', "key_env"),
        ('{"t": {"requests_per_s": 0}}', "requests_per_s"),
        ('{"t": {"callback_hosts": ["https://x.com/hook"]}}', "'t': callback_hosts entry"),
        ('{"t": {"callback_hosts": "x.com"}}', "'t': callback_hosts must be a list"),
        ('{"t": {"callbacks": ["x.com"]}}', "unknown field"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_tenants(bad)


# -- bodies ----------------------------------------------------------------------------------


def test_forms_multipart_and_json_bodies() -> None:
    form = read_fields(
        request(b"method=turnstile&sitekey=a+b", "application/x-www-form-urlencoded", "key=k")
    )
    assert form.text == {"key": "k", "method": "turnstile", "sitekey": "a b"}
    image = png(2048)
    boundary = "XyZ"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="method"\r\n\r\npost\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="c.png"\r\n'
            "Content-Type: image/png\r\n\r\n"
        ).encode()
        + image
        + f"\r\n--{boundary}--\r\n".encode()
    )
    parts = read_fields(request(body, f"multipart/form-data; boundary={boundary}"))
    assert parts.text == {"method": "post"} and parts.files == {"file": image}
    assert read_json(request(b'{"clientKey": "k", "taskId": 3}')) == {"clientKey": "k", "taskId": 3}
    for bad in (b"{nope", b"[1, 2]", b"\xff"):
        with pytest.raises(Unreadable):
            read_json(request(bad, "application/json"))
    for bad, kind in [
        (b"\xff\xfe", "application/x-www-form-urlencoded"),
        (b"<xml/>", "application/xml"),
        (b"{nope", "application/json"),
        (b"no parts", "multipart/form-data; boundary=q"),
    ]:
        with pytest.raises(Unreadable):
            read_fields(request(bad, kind))


# -- what Redis keeps ----------------------------------------------------------------------


def test_tickets_and_counters_layout() -> None:
    ticket = Ticket("shop", "turnstile", task_id="abc")
    assert Ticket.from_json(ticket.to_json()) == ticket
    pooled = Ticket("shop", "turnstile", outcome={"status": "solved", "token": "t"})
    assert Ticket.from_json(pooled.to_json()) == pooled
    table = _tabulate(
        [
            ("requests|shop|2captcha|in.php", "3"),
            ("errors|shop|2captcha|in.php|ERROR_PAGEURL", "1"),
            ("bucket|shop|2captcha|in.php|0", "2"),
            (f"bucket|shop|2captcha|in.php|{len(LATENCY_BUCKETS)}", "1"),
            ("seconds|shop|2captcha|in.php", "1.5"),
            ("junk", "1"),
        ]
    )
    [(where, row)] = table.items()
    assert where == ("shop", "2captcha", "in.php")
    assert (row.requests, dict(row.errors), row.seconds) == (3, {"ERROR_PAGEURL": 1}, 1.5)
    assert row.buckets[0] == 2 and row.buckets[-1] == 1


def test_capmonster_clients_tasks_as_its_sdk_sends_them() -> None:
    turnstile = tasktypes.solve_kwargs(
        {"type": "TurnstileTask", "websiteURL": PAGE, "websiteKey": "0x4", "pageAction": "login"}
    )
    assert turnstile == {
        "method": "turnstile",
        "pageurl": PAGE,
        "sitekey": "0x4",
        "action": "login",
    }
    geetest = tasktypes.solve_kwargs(
        {"type": "GeeTestTask", "websiteURL": PAGE, "gt": "g", "version": 3, "challenge": "c"}
    )
    assert geetest == {"method": "geetest", "pageurl": PAGE, "sitekey": "g", "challenge": "c"}
    with pytest.raises(tasktypes.BadTask, match="v3"):
        tasktypes.solve_kwargs({"type": "GeeTestTask", "websiteURL": PAGE, "gt": "g", "version": 4})
    image = tasktypes.solve_kwargs(
        {
            "type": "ImageToTextTask",
            "body": "QUJD",
            "Case": True,
            "recognizingThreshold": 70,
            "math": False,
        }
    )
    assert image == {"method": "base64", "body": "QUJD", "regsense": 1, "calc": 0}

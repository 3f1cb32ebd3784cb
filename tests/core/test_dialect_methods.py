"""Every method of :mod:`captcha_tasks.methods` in every JSON dialect: the task type it
becomes with and without a proxy (or none: the dialect's providers do not take it), the
fields of its parameters, how each dialect writes a proxy and cookies, and routing past a
provider whose dialect lacks a method or variant.  Pure: no socket."""

from __future__ import annotations

from typing import Any

import pytest
from image_files import png_b64

from captcha_tasks import errors
from captcha_tasks.core import routing
from captcha_tasks.core.decisions import Fail
from captcha_tasks.core.dialects import (
    ANTICAPTCHA,
    CAPMONSTER,
    CAPSOLVER,
    DIALECTS,
    build_task,
    parse_cookies,
    variant_of,
)
from captcha_tasks.core.health import Circuit
from captcha_tasks.core.job import Job
from captcha_tasks.core.providers import ProviderSpec
from captcha_tasks.core.routing import Destination
from captcha_tasks.methods import METHODS, build_request
from captcha_tasks.providers.jsonapi import parse_task_reply

pytestmark = pytest.mark.unit

PAGE = "https://example.com/methods"
PROXY = {"proxy": "user:s3cret@10.0.0.1:3128", "proxytype": "HTTP"}
KINDS = ("anticaptcha", "capsolver", "capmonster")

#: name -> (method, parameters).
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "recaptcha v2": ("userrecaptcha", {}),
    "recaptcha v2 invisible": ("userrecaptcha", {"invisible": 1}),
    "recaptcha v2 enterprise": ("userrecaptcha", {"enterprise": 1}),
    "recaptcha v3": ("userrecaptcha", {"version": "v3", "action": "login", "min_score": 0.7}),
    "recaptcha v3 enterprise": ("userrecaptcha", {"version": "v3", "enterprise": 1}),
    "turnstile": ("turnstile", {"action": "signup", "data": "cdata-1"}),
    "geetest v3": ("geetest", {"challenge": "c" * 32}),
    "image": ("base64", {}),
    "cloudflare challenge": ("cloudflare_challenge", dict(PROXY)),
    "grid": ("grid", {"instructions": "cars", "grid_size": "3x3"}),
    "bls": ("bls", {"instructions": "cars"}),
    "captchafox": ("captchafox", dict(PROXY)),
    "friendly captcha": ("friendly_captcha", {}),
    "lemin": ("lemin", {"div_id": "lemin-box"}),
}

#: name -> per kind (anticaptcha, capsolver, capmonster): (proxyless type, proxied type).
EXPECTED: dict[str, tuple[tuple[str | None, str | None], ...]] = {
    "recaptcha v2": (
        ("RecaptchaV2TaskProxyless", "RecaptchaV2Task"),
        ("ReCaptchaV2TaskProxyLess", "ReCaptchaV2Task"),
        ("RecaptchaV2Task", "RecaptchaV2Task"),
    ),
    "recaptcha v2 invisible": (
        ("RecaptchaV2TaskProxyless", "RecaptchaV2Task"),
        ("ReCaptchaV2TaskProxyLess", "ReCaptchaV2Task"),
        ("RecaptchaV2Task", "RecaptchaV2Task"),
    ),
    "recaptcha v2 enterprise": (
        ("RecaptchaV2EnterpriseTaskProxyless", "RecaptchaV2EnterpriseTask"),
        ("ReCaptchaV2EnterpriseTaskProxyLess", "ReCaptchaV2EnterpriseTask"),
        ("RecaptchaV2EnterpriseTask", "RecaptchaV2EnterpriseTask"),
    ),
    "recaptcha v3": (
        ("RecaptchaV3TaskProxyless", None),
        ("ReCaptchaV3TaskProxyLess", "ReCaptchaV3Task"),
        ("RecaptchaV3TaskProxyless", None),
    ),
    "recaptcha v3 enterprise": (
        ("RecaptchaV3TaskProxyless", None),
        ("ReCaptchaV3EnterpriseTaskProxyLess", "ReCaptchaV3EnterpriseTask"),
        ("RecaptchaV3EnterpriseTask", None),
    ),
    "turnstile": (
        ("TurnstileTaskProxyless", "TurnstileTask"),
        ("AntiTurnstileTaskProxyLess", None),
        ("TurnstileTask", "TurnstileTask"),
    ),
    "geetest v3": (
        ("GeeTestTaskProxyless", "GeeTestTask"),
        ("GeeTestTaskProxyLess", None),
        ("GeeTestTask", "GeeTestTask"),
    ),
    "image": (("ImageToTextTask", None),) * 3,
    "cloudflare challenge": ((None, None), (None, "AntiCloudflareTask"), (None, None)),
    "grid": ((None, None),) * 3,
    "bls": ((None, None),) * 3,
    "captchafox": ((None, None),) * 3,
    "friendly captcha": ((None, None),) * 3,
    "lemin": ((None, None),) * 3,
}


def _can_be_asked(name: str, proxied: int) -> bool:
    """An image takes no proxy; a method that needs one is never asked without it."""
    method = REQUESTS[name][0]
    if method in ("base64", "grid", "bls"):
        return not proxied
    return bool(proxied) or "proxy" not in METHODS[method].required


CASES = [
    (name, kind, proxied, EXPECTED[name][index][proxied])
    for name in REQUESTS
    for index, kind in enumerate(KINDS)
    for proxied in (0, 1)
    if _can_be_asked(name, proxied)
]


def request_for(name: str, proxied: bool) -> Any:
    method, params = REQUESTS[name]
    params = dict(params)
    if method in ("base64", "grid"):
        params["body"] = png_b64()
    elif method == "bls":
        params["images"] = [png_b64()] * 9
    elif proxied:
        params.update(PROXY)
    spec = METHODS[method]
    sitekey = "site-key-1" if spec.sitekey_field else None
    pageurl = PAGE if spec.needs_pageurl else None
    return build_request(method, sitekey, pageurl, **params)


def test_every_method_and_variant_is_in_the_table() -> None:
    assert {method for method, _ in REQUESTS.values()} == set(METHODS)
    assert set(EXPECTED) == set(REQUESTS)


@pytest.mark.parametrize(("name", "kind", "proxied", "expected"), CASES)
def test_each_method_becomes_its_dialects_task_type_or_is_refused(
    name: str, kind: str, proxied: int, expected: str | None
) -> None:
    dialect = DIALECTS[kind]
    request = request_for(name, bool(proxied))
    takes_proxy = "proxy" in request.params
    assert dialect.supports(request.method, takes_proxy, variant_of(request)) == bool(expected)
    if expected is None:
        with pytest.raises(errors.ValidationError, match=f"{kind} has no task type"):
            build_task(dialect, request)
        return
    task = build_task(dialect, request)
    assert task["type"] == expected
    # and back: the sandbox's JSON face reads the same method and variant from it
    assert dialect.key_of(task) == (
        request.method + (f":{variant_of(request)}" if variant_of(request) else "")
    )


def test_v2_fields_invisible_and_data_s() -> None:
    request = build_request(
        "userrecaptcha", "site-key-1", PAGE, invisible=1, **{"data-s": "ds-value"}
    )
    for dialect in DIALECTS.values():
        task = build_task(dialect, request)
        assert (task["websiteURL"], task["websiteKey"]) == (PAGE, "site-key-1")
        assert task["isInvisible"] is True
        assert task["recaptchaDataSValue"] == "ds-value"


def test_v3_action_and_min_score_and_enterprise_flag() -> None:
    request = request_for("recaptcha v3", False)
    for dialect in DIALECTS.values():
        task = build_task(dialect, request)
        assert (task["pageAction"], task["minScore"]) == ("login", 0.7)
        assert "isInvisible" not in task
    # Anti-Captcha's workers come in three score groups: minScore is one of them, always
    for asked, sent in ((0.1, 0.3), (0.5, 0.7), (0.7, 0.7), (0.9, 0.9), (None, 0.3)):
        params: dict[str, Any] = {"version": "v3"}
        if asked is not None:
            params["min_score"] = asked
        v3 = build_request("userrecaptcha", "site-key-1", PAGE, **params)
        assert build_task(ANTICAPTCHA, v3)["minScore"] == sent, asked
    assert "minScore" not in build_task(CAPMONSTER, v3)
    enterprise = request_for("recaptcha v3 enterprise", False)
    assert build_task(ANTICAPTCHA, enterprise)["isEnterprise"] is True
    assert "isEnterprise" not in build_task(ANTICAPTCHA, request)
    assert ANTICAPTCHA.key_of(build_task(ANTICAPTCHA, request)) == "userrecaptcha:v3"


def test_turnstile_action_and_cdata_in_each_dialects_fields() -> None:
    request = request_for("turnstile", False)
    anti, solver, monster = (build_task(d, request) for d in (ANTICAPTCHA, CAPSOLVER, CAPMONSTER))
    assert (anti["action"], anti["turnstileCData"]) == ("signup", "cdata-1")
    assert solver["metadata"] == {"action": "signup", "cdata": "cdata-1"}
    assert (monster["pageAction"], monster["data"]) == ("signup", "cdata-1")


def test_geetest_and_image_fields() -> None:
    geetest = build_request("geetest", "gt-key", PAGE, challenge="ch-1", api_server="api-na")
    for dialect in DIALECTS.values():
        task = build_task(dialect, geetest)
        assert (task["gt"], task["challenge"]) == ("gt-key", "ch-1")
        assert task["geetestApiServerSubdomain"] == "api-na"
        assert "websiteKey" not in task
    image = build_request("base64", body=png_b64(), regsense=1, numeric=1, min_len=4)
    anti = build_task(ANTICAPTCHA, image)
    assert (anti["case"], anti["numeric"], anti["minLength"]) == (True, 1, 4)
    assert build_task(CAPSOLVER, image)["case"] is True
    assert "minLength" not in build_task(CAPMONSTER, image)  # no such field: not sent


def test_proxy_cookies_and_user_agent_in_each_dialects_encoding() -> None:
    request = build_request(
        "userrecaptcha",
        "site-key-1",
        PAGE,
        proxy="user:s3cret@10.0.0.1:3128",
        proxytype="SOCKS5",
        cookies="sid:abc;theme:dark",
        userAgent="Mozilla/5.0 test",
    )
    for dialect in (ANTICAPTCHA, CAPMONSTER):
        task = build_task(dialect, request)
        assert task["type"] == "RecaptchaV2Task"
        assert {k: task[k] for k in task if k.startswith("proxy")} == {
            "proxyType": "socks5",
            "proxyAddress": "10.0.0.1",
            "proxyPort": 3128,
            "proxyLogin": "user",
            "proxyPassword": "s3cret",
        }
        assert (task["cookies"], task["userAgent"]) == ("sid=abc; theme=dark", "Mozilla/5.0 test")
    solver = build_task(CAPSOLVER, request)
    assert solver["type"] == "ReCaptchaV2Task"
    assert solver["proxy"] == "socks5:10.0.0.1:3128:user:s3cret"
    assert not any(k.startswith("proxy") and k != "proxy" for k in solver)
    assert solver["cookies"] == [
        {"name": "sid", "value": "abc"},
        {"name": "theme", "value": "dark"},
    ]
    assert solver["userAgent"] == "Mozilla/5.0 test"
    # a proxy written with its scheme, without credentials
    bare = build_request("turnstile", "0x4A", PAGE, proxy="http://10.0.0.2:8080")
    assert build_task(CAPMONSTER, bare)["proxyType"] == "http"
    assert "proxyLogin" not in build_task(CAPMONSTER, bare)
    assert build_task(ANTICAPTCHA, bare)["proxyAddress"] == "10.0.0.2"


def test_cookies_in_either_notation_and_a_bad_one_is_named_not_shown() -> None:
    assert parse_cookies("a:1; b=2;") == [("a", "1"), ("b", "2")]
    assert parse_cookies("url:https://x.test/a=b") == [("url", "https://x.test/a=b")]
    with pytest.raises(errors.ValidationError) as info:
        parse_cookies("s3cret-session-value")
    assert "s3cret" not in str(info.value)


def test_answers_of_the_new_methods_in_the_shape_in_php_gives() -> None:
    ready = {"errorId": 0, "status": "ready"}
    geetest = {"challenge": "c", "validate": "v", "seccode": "s"}
    answer = parse_task_reply(CAPMONSTER, {**ready, "solution": geetest})
    assert answer.value == {  # type: ignore[union-attr]
        "geetest_challenge": "c",
        "geetest_validate": "v",
        "geetest_seccode": "s",
    }
    challenge = {"cookies": {"cf_clearance": "cf.123"}, "token": "t", "userAgent": "UA/1"}
    answer = parse_task_reply(CAPSOLVER, {**ready, "solution": challenge})
    assert (answer.value, answer.user_agent) == ("cf.123", "UA/1")  # type: ignore[union-attr]


T0 = 1_000_000.0
MAIN = ProviderSpec("main", "http://main", "k1", 5, "fallback", methods=frozenset({"base64"}))
ANTI = ProviderSpec("anti", "http://anti", "k2", 5, "fallback", kind="anticaptcha")
SOLVER = ProviderSpec("solver", "http://solver", "k3", 5, "fallback", kind="capsolver")
MONSTER = ProviderSpec("monster", "http://monster", "k4", 5, "fallback", kind="capmonster")


def route(name: str, proxied: bool, *providers: ProviderSpec) -> object:
    job = Job.new("solve-1", request_for(name, proxied), T0, 300.0)
    views = {p.name: Circuit(p.name) for p in providers}
    return routing.route(job, providers, views, T0)


def test_routing_skips_a_provider_whose_dialect_lacks_the_method_or_variant() -> None:
    # Anti-Captcha first, but it has no v3 task with a proxy: CapSolver's takes it
    assert route("recaptcha v3", True, ANTI, SOLVER) == Destination("solver", ())
    assert route("recaptcha v3", False, ANTI, SOLVER) == Destination("anti", ())
    # only CapSolver has a Cloudflare challenge task
    assert route("cloudflare challenge", True, ANTI, MONSTER, SOLVER) == Destination("solver", ())


def test_no_provider_that_takes_it_is_a_clear_error_naming_each_ones_reason() -> None:
    decided = route("recaptcha v3", True, MAIN, ANTI, MONSTER)
    assert isinstance(decided, Fail)
    assert isinstance(decided.error, errors.ValidationError)
    message = str(decided.error)
    assert "no provider takes method 'userrecaptcha' (v3) with a proxy: " in message
    assert "main (not in its methods)" in message
    assert "anti (anticaptcha has no task type for it)" in message
    assert "monster (capmonster has no task type for it)" in message
    assert "s3cret" not in message

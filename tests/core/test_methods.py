from __future__ import annotations

import base64
from typing import Any

import pytest
from image_files import png, png_b64

from captcha_tasks.errors import ValidationError
from captcha_tasks.methods import (
    BLS_IMAGES,
    MAX_IMAGE_BYTES,
    METHODS,
    MIN_IMAGE_BYTES,
    build_request,
)

pytestmark = pytest.mark.unit

PAGE = "https://example.com/login"
PROXY = "user:pw@10.0.0.1:3128"
#: The parameters each method needs besides sitekey and pageurl.
NEEDS: dict[str, dict[str, Any]] = {
    "geetest": {"challenge": "c"},
    "captchafox": {"proxy": PROXY},
    "lemin": {"div_id": "lemin-cropped-captcha"},
}


@pytest.mark.parametrize(
    ("method", "sitekey_field"),
    [(name, spec.sitekey_field) for name, spec in METHODS.items() if spec.sitekey_field],
)
def test_sitekey_maps_to_api_field(method: str, sitekey_field: str) -> None:
    fields = build_request(method, "SITE", PAGE, **NEEDS.get(method, {})).api_fields()
    assert fields[sitekey_field] == "SITE"
    assert fields["method"] == method
    assert fields["pageurl"] == PAGE


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"method": "hcaptcha_x", "sitekey": "k", "pageurl": PAGE}, "unknown method"),
        ({"method": None, "sitekey": "k", "pageurl": PAGE}, "method is required"),
        ({"method": "userrecaptcha", "pageurl": PAGE}, "sitekey"),
        ({"method": "turnstile", "sitekey": " ", "pageurl": PAGE}, "sitekey"),
        ({"method": "turnstile", "sitekey": "k"}, "pageurl"),
        ({"method": "turnstile", "sitekey": "k", "pageurl": "ftp://x.org"}, "http(s)"),
        ({"method": "turnstile", "sitekey": "k", "pageurl": "example.com"}, "http(s)"),
        ({"method": "geetest", "sitekey": "gt", "pageurl": PAGE}, "challenge"),
        ({"method": "turnstile", "sitekey": "k", "pageurl": PAGE, "googlekey": "x"}, "googlekey"),
        ({"method": "base64"}, "body"),
        ({"method": "base64", "body": "not base64!"}, "base64"),
        ({"method": "userrecaptcha", "sitekey": "k", "pageurl": PAGE, "min_score": 2}, "min_score"),
        ({"method": "turnstile", "sitekey": "k", "pageurl": PAGE, "proxytype": "FTP"}, "proxytype"),
        # grid
        ({"method": "grid", "instructions": "bus", "grid_size": "3x3"}, "body"),
        ({"method": "grid", "body": png_b64(), "grid_size": "3x3"}, "instructions"),
        ({"method": "grid", "body": png_b64(), "instructions": "bus"}, "grid_size"),
        (
            {"method": "grid", "body": png_b64(), "instructions": "bus", "grid_size": "5x5"},
            "grid_size must be one of 3x3, 4x4",
        ),
        (
            {"method": "grid", "body": png_b64(), "instructions": "  ", "grid_size": "3x3"},
            "instructions must not be blank",
        ),
        (
            {"method": "grid", "sitekey": "k", "body": png_b64(), "instructions": "x"},
            "takes no sitekey",
        ),
        # bls
        ({"method": "bls", "instructions": "cars"}, "images"),
        ({"method": "bls", "images": [png()] * BLS_IMAGES}, "instructions"),
        ({"method": "bls", "images": [png()] * 8, "instructions": "x"}, "9 images, got 8"),
        ({"method": "bls", "images": png_b64(), "instructions": "x"}, "images must be a list"),
        (
            {"method": "bls", "images": [png()] * 8 + [b"GIF89a"], "instructions": "x"},
            "image 9 is 6 bytes",
        ),
        ({"method": "bls", "images": [png()] * 8 + [7], "instructions": "x"}, "image 9 must be"),
        # cloudflare_challenge
        ({"method": "cloudflare_challenge"}, "pageurl is required"),
        ({"method": "cloudflare_challenge", "pageurl": PAGE}, "proxy"),
        (
            {"method": "cloudflare_challenge", "pageurl": PAGE, "proxy": PROXY, "sitekey": "k"},
            "takes no sitekey",
        ),
        # captchafox
        ({"method": "captchafox", "pageurl": PAGE, "proxy": PROXY}, "sitekey"),
        ({"method": "captchafox", "sitekey": "k", "proxy": PROXY}, "pageurl"),
        ({"method": "captchafox", "sitekey": "k", "pageurl": PAGE}, "proxy"),
        # friendly_captcha
        ({"method": "friendly_captcha", "pageurl": PAGE}, "sitekey"),
        ({"method": "friendly_captcha", "sitekey": "k"}, "pageurl"),
        (
            {"method": "friendly_captcha", "sitekey": "k", "pageurl": PAGE, "version": "v3"},
            "version must be one of v1, v2",
        ),
        # lemin
        ({"method": "lemin", "pageurl": PAGE, "div_id": "d"}, "sitekey"),
        ({"method": "lemin", "sitekey": "CROPPED_x", "pageurl": PAGE}, "div_id"),
        (
            {"method": "lemin", "pageurl": PAGE, "captcha_id": "C", "div_id": "d", "sitekey": "C"},
            "takes its captcha_id as sitekey",
        ),
        # the user agent, named two ways
        (
            {
                "method": "turnstile",
                "sitekey": "k",
                "pageurl": PAGE,
                "user_agent": "A",
                "userAgent": "B",
            },
            "user_agent and userAgent",
        ),
    ],
)
def test_validation_errors_name_the_problem(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        build_request(**kwargs)  # type: ignore[arg-type]
    assert needle in str(info.value)


def test_image_size_limits_follow_captchaai() -> None:
    accepted = png_b64(1000 * 1024)
    assert build_request("base64", body=accepted).params["body"] == accepted
    for size in (1100 * 1024, MAX_IMAGE_BYTES + 1):
        with pytest.raises(ValidationError, match=f"at most {MAX_IMAGE_BYTES} bytes"):
            build_request("base64", body=png_b64(size))
    assert build_request("base64", body=png_b64(MIN_IMAGE_BYTES)).params["body"]
    with pytest.raises(ValidationError, match=f"at least {MIN_IMAGE_BYTES} bytes"):
        build_request("base64", body=base64.b64encode(png(MIN_IMAGE_BYTES)[:-1]).decode())


@pytest.mark.parametrize(
    ("head", "ok"),
    [
        (b"\xff\xd8\xff\xe0", True),  # jpg / jpeg
        (b"GIF87a", True),
        (b"GIF89a", True),
        (b"BM", False),  # bmp
        (b"RIFF\x00\x00\x00\x00WEBP", False),
        (b"<svg ", False),
    ],
)
def test_image_formats_follow_captchaai(head: bytes, ok: bool) -> None:
    body = head + bytes(2048)
    if ok:
        assert build_request("grid", body=body, instructions="x", grid_size="4x4").params["body"]
    else:
        with pytest.raises(ValidationError, match="not a jpg, jpeg, png or gif"):
            build_request("base64", body=body)


def test_image_bytes_are_encoded_and_bools_become_ints() -> None:
    image = png()
    req = build_request("base64", body=image, numeric=1, phrase=True)
    assert base64.b64decode(str(req.params["body"])) == image
    assert req.params["phrase"] == 1
    assert req.sitekey is None and "pageurl" not in req.api_fields()


def test_grid_is_sent_as_a_base64_captcha_with_its_grid() -> None:
    body = png_b64()
    fields = build_request("grid", body=body, instructions="bus", grid_size="3x3").api_fields()
    assert fields == {
        "method": "base64",
        "body": body,
        "instructions": "bus",
        "grid_size": "3x3",
        "img_type": "recaptcha",
    }


def test_bls_sends_nine_numbered_data_uris() -> None:
    gif = b"GIF89a" + bytes(2000)
    images: list[Any] = [png()] * 4 + [base64.b64encode(gif).decode()] * 4 + [png_b64()]
    req = build_request("bls", images=images, instructions="cars")
    fields = req.api_fields()
    assert fields["method"] == "bls" and fields["instructions"] == "cars"
    uris = [fields[f"image_base64_{n}"] for n in range(1, BLS_IMAGES + 1)]
    assert [str(u).split(",")[0] for u in uris] == ["data:image/png;base64"] * 4 + [
        "data:image/gif;base64"
    ] * 4 + ["data:image/png;base64"]
    assert base64.b64decode(str(uris[4]).split(",", 1)[1]) == gif
    # a request travels as JSON and is validated again by the worker
    again = build_request(req.method, req.sitekey, req.pageurl, **req.to_dict()["params"])
    assert again.api_fields() == fields
    assert req.per_request


def test_lemin_names_its_fields_as_the_api_does() -> None:
    fields = build_request(
        "lemin",
        "CROPPED_3dfdd5c_d1872b526b794d83ba3b365eb15a200b",
        PAGE,
        div_id="lemin-cropped-captcha",
        api_server="api.leminnow.com",
    ).api_fields()
    assert fields["captcha_id"] == "CROPPED_3dfdd5c_d1872b526b794d83ba3b365eb15a200b"
    assert fields["div_id"] == "lemin-cropped-captcha"
    assert fields["apiServer"] == "api.leminnow.com" and "api_server" not in fields


def test_user_agent_is_accepted_under_both_names() -> None:
    for name in ("user_agent", "userAgent"):
        req = build_request("turnstile", "k", PAGE, **{name: "Mozilla/5.0 X"})
        assert req.api_fields()["userAgent"] == "Mozilla/5.0 X"
        assert "user_agent" not in req.params


def test_a_solve_without_method_is_a_validation_error_naming_it() -> None:
    with pytest.raises(ValidationError, match="method is required"):
        build_request(sitekey="k", pageurl=PAGE)  # once a TypeError: a missing argument
    with pytest.raises(ValidationError, match="method is required"):
        build_request(**{"sitekey": "k", "pageurl": PAGE})


@pytest.mark.parametrize("method", ["cloudflare_challenge", "captchafox"])
@pytest.mark.parametrize("proxytype", ["SOCKS4", "SOCKS5", "socks5"])
def test_http_only_methods_refuse_a_socks_proxy_naming_method_and_proxytype(
    method: str, proxytype: str
) -> None:
    sitekey = "k" if METHODS[method].sitekey_field else None
    with pytest.raises(ValidationError) as info:
        build_request(method, sitekey, PAGE, proxy=PROXY, proxytype=proxytype)
    assert "proxytype" in str(info.value) and repr(method) in str(info.value)
    assert "HTTP, HTTPS" in str(info.value)
    # a proxy written with its type says the same, without echoing the proxy
    with pytest.raises(ValidationError, match=f"{method!r} takes a proxy of proxytype") as typed:
        build_request(method, sitekey, PAGE, proxy=f"{proxytype.lower()}://{PROXY}")
    assert PROXY not in str(typed.value)
    for allowed in ("HTTP", "HTTPS", "http"):
        request = build_request(method, sitekey, PAGE, proxy=PROXY, proxytype=allowed)
        assert request.params["proxytype"] == allowed


def test_token_methods_still_take_socks_proxies() -> None:
    request = build_request("turnstile", "k", PAGE, proxy=PROXY, proxytype="SOCKS5")
    assert request.api_fields()["proxytype"] == "SOCKS5"
    assert build_request("userrecaptcha", "k", PAGE, proxy=f"socks5://{PROXY}").params["proxy"]


def test_proxy_methods_default_their_proxytype() -> None:
    req = build_request("cloudflare_challenge", pageurl=PAGE, proxy=PROXY)
    assert req.api_fields()["proxytype"] == "HTTP"
    assert build_request("captchafox", "k", PAGE, proxy="pool").uses_proxy_pool


@pytest.mark.parametrize(
    ("method", "kwargs", "bulk", "agent"),
    [
        ("userrecaptcha", {"sitekey": "k", "pageurl": PAGE}, True, False),
        ("userrecaptcha", {"sitekey": "k", "pageurl": PAGE, "enterprise": 1}, False, True),
        ("userrecaptcha", {"sitekey": "k", "pageurl": PAGE, "enterprise": 0}, True, False),
        ("turnstile", {"sitekey": "k", "pageurl": PAGE}, True, False),
        ("friendly_captcha", {"sitekey": "k", "pageurl": PAGE}, True, False),
        ("geetest", {"sitekey": "k", "pageurl": PAGE, "challenge": "c"}, False, False),
        ("lemin", {"sitekey": "k", "pageurl": PAGE, "div_id": "d"}, False, False),
        ("base64", {"body": png_b64()}, False, False),
        ("grid", {"body": png_b64(), "instructions": "x", "grid_size": "3x3"}, False, False),
        ("bls", {"images": [png()] * BLS_IMAGES, "instructions": "x"}, False, False),
        ("cloudflare_challenge", {"pageurl": PAGE, "proxy": PROXY}, False, True),
        ("captchafox", {"sitekey": "k", "pageurl": PAGE, "proxy": PROXY}, False, True),
    ],
)
def test_only_plain_tokens_are_asked_for_in_bulk(
    method: str, kwargs: dict[str, Any], bulk: bool, agent: bool
) -> None:
    req = build_request(method, **kwargs)
    assert (req.pipe_safe, req.returns_user_agent) == (bulk, agent)


@pytest.mark.parametrize(
    ("method", "kwargs", "sent", "value"),
    [
        ("grid", {"body": png_b64(), "instructions": "x", "grid_size": "3x3"}, "[1,4]", [1, 4]),
        ("bls", {"images": [png()] * BLS_IMAGES, "instructions": "x"}, [2, 9], [2, 9]),
        (
            "lemin",
            {"sitekey": "k", "pageurl": PAGE, "div_id": "d"},
            '{"answer":"a"}',
            {"answer": "a"},
        ),
        ("geetest", {"sitekey": "k", "pageurl": PAGE, "challenge": "c"}, {"v": 1}, {"v": 1}),
        # text that is not JSON of the method's shape is kept as sent
        (
            "grid",
            {"body": png_b64(), "instructions": "x", "grid_size": "3x3"},
            "click:1/4",
            "click:1/4",
        ),
        ("bls", {"images": [png()] * BLS_IMAGES, "instructions": "x"}, '{"a":1}', '{"a":1}'),
        ("turnstile", {"sitekey": "k", "pageurl": PAGE}, "[1]", "[1]"),
        ("base64", {"body": png_b64()}, "12|3", "12|3"),
    ],
)
def test_answers_take_their_method_shape(
    method: str, kwargs: dict[str, Any], sent: Any, value: Any
) -> None:
    assert build_request(method, **kwargs).answer_value(sent) == value


def test_v3_waits_less_than_v2() -> None:
    v2 = build_request("userrecaptcha", "k", PAGE)
    v3 = build_request("userrecaptcha", "k", PAGE, version="v3", action="login", min_score=0.3)
    assert v3.initial_wait < v2.initial_wait


def test_per_request_params_detected() -> None:
    assert not build_request("turnstile", "k", PAGE).per_request
    assert build_request("turnstile", "k", PAGE, proxy="u:p@1.2.3.4:80").per_request
    assert build_request("turnstile", "k", PAGE, user_agent="Mozilla/5.0").per_request

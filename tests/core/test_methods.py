from __future__ import annotations

import base64

import pytest

from captcha_tasks.errors import ValidationError
from captcha_tasks.methods import MAX_IMAGE_BYTES, METHODS, build_request

PAGE = "https://example.com/login"


@pytest.mark.parametrize(
    ("method", "sitekey_field"),
    [(name, spec.sitekey_field) for name, spec in METHODS.items() if spec.sitekey_field],
)
def test_sitekey_maps_to_api_field(method: str, sitekey_field: str) -> None:
    extra = {"challenge": "c"} if method == "geetest" else {}
    fields = build_request(method, "SITE", PAGE, **extra).api_fields()
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
    ],
)
def test_validation_errors_name_the_problem(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        build_request(**kwargs)  # type: ignore[arg-type]
    assert needle in str(info.value)


def test_image_size_limit() -> None:
    ok = base64.b64encode(b"x" * MAX_IMAGE_BYTES).decode()
    assert build_request("base64", body=ok).params["body"] == ok
    big = base64.b64encode(b"x" * (MAX_IMAGE_BYTES + 1)).decode()
    with pytest.raises(ValidationError, match=str(MAX_IMAGE_BYTES)):
        build_request("base64", body=big)


def test_image_bytes_are_encoded_and_bools_become_ints() -> None:
    req = build_request("base64", body=b"\x89PNG", numeric=1, phrase=True)
    assert base64.b64decode(str(req.params["body"])) == b"\x89PNG"
    assert req.params["phrase"] == 1
    assert req.sitekey is None and "pageurl" not in req.api_fields()


def test_v3_waits_less_than_v2() -> None:
    v2 = build_request("userrecaptcha", "k", PAGE)
    v3 = build_request("userrecaptcha", "k", PAGE, version="v3", action="login", min_score=0.3)
    assert v3.initial_wait < v2.initial_wait


def test_per_request_params_detected() -> None:
    assert not build_request("turnstile", "k", PAGE).per_request
    assert build_request("turnstile", "k", PAGE, proxy="u:p@1.2.3.4:80").per_request

"""The captcha methods we know, and validation of a solve request at the call site.

The public API uses ``sitekey`` for every method; :class:`MethodSpec` maps it to the
field the API expects (``googlekey`` for reCAPTCHA, ``gt`` for GeeTest, ...).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .errors import ValidationError

#: The API rejects images larger than this (decoded bytes).
MAX_IMAGE_BYTES = 100 * 1024

_TOKEN_EXTRAS = frozenset({"proxy", "proxytype", "userAgent", "cookies", "proxy_owner"})
#: ``proxy=POOL_PROXY`` asks the worker for a proxy from the shared proxy pool.
POOL_PROXY = "pool"
#: Parameters that steer the workers and are never sent to the API.
INTERNAL_PARAMS = frozenset({"proxy_owner"})
_PROXY_TYPES = frozenset({"HTTP", "HTTPS", "SOCKS4", "SOCKS5"})

Scalar = str | int | float


@dataclass(frozen=True)
class MethodSpec:
    name: str
    #: API field that receives the public ``sitekey`` (None: the method has none).
    sitekey_field: str | None
    needs_pageurl: bool
    #: Seconds before the first poll, as the official SDKs wait.
    initial_wait: float
    #: Seconds a solved answer stays usable.
    token_life: float
    #: Whether the answer can travel in a pipe-separated bulk reply.
    pipe_safe: bool
    optional: frozenset[str] = field(default_factory=frozenset)
    required: frozenset[str] = field(default_factory=frozenset)


METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        MethodSpec(
            "userrecaptcha",
            "googlekey",
            True,
            initial_wait=15.0,
            token_life=120.0,
            pipe_safe=True,
            optional=_TOKEN_EXTRAS
            | {"invisible", "enterprise", "data-s", "version", "action", "min_score"},
        ),
        MethodSpec(
            "turnstile",
            "sitekey",
            True,
            initial_wait=10.0,
            token_life=300.0,
            pipe_safe=True,
            optional=_TOKEN_EXTRAS | {"action", "data", "pagedata"},
        ),
        MethodSpec(
            "geetest",
            "gt",
            True,
            initial_wait=15.0,
            token_life=120.0,
            pipe_safe=False,
            optional=_TOKEN_EXTRAS | {"api_server"},
            required=frozenset({"challenge"}),
        ),
        MethodSpec(
            "base64",
            None,
            False,
            initial_wait=3.0,
            token_life=600.0,
            pipe_safe=False,
            optional=frozenset(
                {
                    "numeric",
                    "min_len",
                    "max_len",
                    "phrase",
                    "regsense",
                    "calc",
                    "lang",
                    "textinstructions",
                }
            ),
            required=frozenset({"body"}),
        ),
    )
}

#: Parameters bound to one request: a token solved with them is useless to anyone else.
PER_REQUEST_PARAMS = frozenset({"proxy", "proxytype", "userAgent", "cookies", "data-s", "body"})


def default_wait(method: str, params: Mapping[str, Any]) -> float:
    """Seconds before the first poll of a captcha, as the official SDKs wait."""
    if method == "userrecaptcha" and params.get("version") == "v3":
        return 10.0
    return METHODS[method].initial_wait


@dataclass(frozen=True)
class SolveRequest:
    """A validated solve request; ``params`` holds the method's extra API fields."""

    method: str
    sitekey: str | None
    pageurl: str | None
    params: Mapping[str, Scalar] = field(default_factory=dict)

    @property
    def spec(self) -> MethodSpec:
        return METHODS[self.method]

    @property
    def initial_wait(self) -> float:
        return default_wait(self.method, self.params)

    def api_fields(self) -> dict[str, Scalar]:
        """The ``in.php`` fields of this request (without the key)."""
        data: dict[str, Scalar] = {"method": self.method}
        if self.spec.sitekey_field and self.sitekey is not None:
            data[self.spec.sitekey_field] = self.sitekey
        if self.pageurl is not None:
            data["pageurl"] = self.pageurl
        data.update((k, v) for k, v in self.params.items() if k not in INTERNAL_PARAMS)
        return data

    @property
    def uses_proxy_pool(self) -> bool:
        return self.params.get("proxy") == POOL_PROXY

    def with_proxy(self, proxy: str, proxytype: str) -> SolveRequest:
        """This request with a concrete proxy in place of ``proxy="pool"``."""
        params = {k: v for k, v in self.params.items() if k not in INTERNAL_PARAMS}
        params.update(proxy=proxy, proxytype=proxytype)
        return SolveRequest(self.method, self.sitekey, self.pageurl, params)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "sitekey": self.sitekey,
            "pageurl": self.pageurl,
            "params": dict(self.params),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SolveRequest:
        return cls(data["method"], data.get("sitekey"), data.get("pageurl"), data["params"])

    @property
    def per_request(self) -> bool:
        """True when the answer is bound to this request's proxy, cookies, data-s, image."""
        return any(name in PER_REQUEST_PARAMS for name in self.params)


def build_request(
    method: str | None,
    sitekey: str | None = None,
    pageurl: str | None = None,
    **params: Any,
) -> SolveRequest:
    """Validate a solve request, raising :class:`ValidationError` naming what is wrong."""
    if not method:
        raise ValidationError("method is required; one of " + ", ".join(sorted(METHODS)))
    spec = METHODS.get(method)
    if spec is None:
        raise ValidationError(f"unknown method {method!r}; use one of {', '.join(sorted(METHODS))}")
    if spec.sitekey_field is not None:
        sitekey = _required_text("sitekey", sitekey, method)
    elif sitekey is not None:
        raise ValidationError(f"method {method!r} takes no sitekey")
    if spec.needs_pageurl or pageurl is not None:
        pageurl = _check_pageurl(_required_text("pageurl", pageurl, method))
    clean = _check_params(spec, params)
    return SolveRequest(method, sitekey, pageurl, clean)


def _required_text(name: str, value: object, method: str) -> str:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValidationError(f"{name} is required for method {method!r}")
    if not isinstance(value, str):
        raise ValidationError(f"{name} must be a string, not {type(value).__name__}")
    return value.strip()


def _check_pageurl(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValidationError(f"pageurl must be an http(s) URL, got {url[:80]!r}")
    return url


def _check_params(spec: MethodSpec, params: Mapping[str, Any]) -> dict[str, Scalar]:
    unknown = set(params) - spec.optional - spec.required
    if unknown:
        raise ValidationError(
            f"unknown parameter(s) for method {spec.name!r}: {', '.join(sorted(unknown))}"
        )
    missing = spec.required - {k for k, v in params.items() if v not in (None, "")}
    if missing:
        raise ValidationError(
            f"missing parameter(s) for method {spec.name!r}: {', '.join(sorted(missing))}"
        )
    clean: dict[str, Scalar] = {}
    for name, value in params.items():
        if value is None:
            continue
        clean[name] = _scalar(name, value)
    if spec.name == "base64":
        clean["body"] = _check_image(clean["body"])
    if "proxytype" in clean and str(clean["proxytype"]).upper() not in _PROXY_TYPES:
        raise ValidationError(f"proxytype must be one of {', '.join(sorted(_PROXY_TYPES))}")
    if "proxy_owner" in clean and clean.get("proxy") != POOL_PROXY:
        raise ValidationError('proxy_owner goes with proxy="pool"')
    if "proxy" in clean and "proxytype" not in clean and clean["proxy"] != POOL_PROXY:
        clean["proxytype"] = "HTTP"
    if "min_score" in clean:
        _check_min_score(clean["min_score"])
    return clean


def _scalar(name: str, value: object) -> Scalar:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, bytes) and name == "body":
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, str | int | float):
        return value
    raise ValidationError(f"parameter {name!r} must be a string or number")


def _check_image(body: Scalar) -> str:
    text = str(body)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError("body must be base64-encoded image bytes") from None
    if not raw:
        raise ValidationError("body is empty")
    if len(raw) > MAX_IMAGE_BYTES:
        raise ValidationError(
            f"image is {len(raw)} bytes; the API accepts at most {MAX_IMAGE_BYTES} bytes"
        )
    return text


def _check_min_score(value: Scalar) -> None:
    try:
        score = float(value)
    except ValueError:
        raise ValidationError("min_score must be a number between 0.1 and 0.9") from None
    if not 0.1 <= score <= 0.9:
        raise ValidationError("min_score must be between 0.1 and 0.9")

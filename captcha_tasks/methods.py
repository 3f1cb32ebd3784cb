"""The captcha methods we know, and validation of a solve request at the call site.

The public API uses ``sitekey`` for every method; :class:`MethodSpec` maps it to the
field the API expects (``googlekey`` for reCAPTCHA, ``gt`` for GeeTest, ...).  Method
names follow CaptchaAI's official SDK; :attr:`MethodSpec.api_method` is the ``method``
value ``in.php`` receives (``grid`` is sent as ``base64``).
"""

from __future__ import annotations

import base64
import binascii
import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from .errors import ValidationError

#: CaptchaAI refuses images larger than this (``ERROR_TOO_BIG_CAPTCHA_FILESIZE``) ...
MAX_IMAGE_BYTES = 1024 * 1024
#: ... and calls smaller ones empty (``ERROR_ZERO_CAPTCHA_FILESIZE``).
MIN_IMAGE_BYTES = 1024
#: The image formats CaptchaAI lists, by their first bytes (jpg and jpeg are one format).
IMAGE_FORMATS: Mapping[bytes, str] = {
    b"\xff\xd8\xff": "jpeg",
    b"\x89PNG\r\n\x1a\n": "png",
    b"GIF87a": "gif",
    b"GIF89a": "gif",
}
#: A BLS captcha is a 3x3 grid of separate images.
BLS_IMAGES = 9

_TOKEN_EXTRAS = frozenset({"proxy", "proxytype", "userAgent", "cookies", "proxy_owner"})
#: ``proxy=POOL_PROXY`` asks the worker for a proxy from the shared proxy pool.
POOL_PROXY = "pool"
#: Parameters that steer the workers and are never sent to the API.
INTERNAL_PARAMS = frozenset({"proxy_owner"})
_PROXY_TYPES = frozenset({"HTTP", "HTTPS", "SOCKS4", "SOCKS5"})
#: CaptchaAI solves the Cloudflare challenge and CaptchaFox through HTTP(S) proxies only.
_HTTP_PROXY_TYPES = frozenset({"HTTP", "HTTPS"})
#: The caller may name the user agent as CaptchaAI's SDK does; the API field is ``userAgent``.
_ALIASES = {"user_agent": "userAgent"}

Scalar = str | int | float
#: A request parameter: a scalar, or a list of base64 images (``bls``).
Param = Scalar | list[str]
AnswerShape = Literal["text", "object", "list"]


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
    #: The ``method`` value ``in.php`` receives (default: the name).
    api_method: str = ""
    #: The answer's shape: a string, or JSON text the API sends for an object or a list.
    answer: AnswerShape = "text"
    #: The answer comes with a user agent that must be used together with it.
    user_agent: bool = False
    #: Allowed values of some parameters.
    choices: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: Values sent when the caller gives none (as CaptchaAI's SDK sends them).
    defaults: Mapping[str, Scalar] = field(default_factory=dict)
    #: Parameters the API knows under another name.
    api_names: Mapping[str, str] = field(default_factory=dict)
    #: The ``proxytype`` values the method's proxy may have.
    proxy_types: frozenset[str] = _PROXY_TYPES

    @property
    def wire_method(self) -> str:
        return self.api_method or self.name


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
            answer="object",
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
        MethodSpec(
            "grid",
            None,
            False,
            initial_wait=1.0,
            token_life=600.0,
            pipe_safe=False,
            optional=frozenset({"img_type"}),
            required=frozenset({"body", "instructions", "grid_size"}),
            api_method="base64",
            answer="list",
            choices={"grid_size": frozenset({"3x3", "4x4"})},
            defaults={"img_type": "recaptcha"},
        ),
        MethodSpec(
            "bls",
            None,
            False,
            initial_wait=1.0,
            token_life=600.0,
            pipe_safe=False,
            required=frozenset({"images", "instructions"}),
            answer="list",
        ),
        MethodSpec(
            "cloudflare_challenge",
            None,
            True,
            initial_wait=15.0,
            # Cloudflare's default "challenge passage" keeps cf_clearance for 30 minutes.
            token_life=1800.0,
            pipe_safe=False,
            optional=_TOKEN_EXTRAS,
            required=frozenset({"proxy"}),
            user_agent=True,
            proxy_types=_HTTP_PROXY_TYPES,
        ),
        MethodSpec(
            "captchafox",
            "sitekey",
            True,
            initial_wait=10.0,
            token_life=120.0,
            pipe_safe=False,
            optional=_TOKEN_EXTRAS,
            required=frozenset({"proxy"}),
            user_agent=True,
            proxy_types=_HTTP_PROXY_TYPES,
        ),
        MethodSpec(
            "friendly_captcha",
            "sitekey",
            True,
            initial_wait=10.0,
            token_life=300.0,
            pipe_safe=True,
            optional=_TOKEN_EXTRAS | {"version"},
            choices={"version": frozenset({"v1", "v2"})},
        ),
        MethodSpec(
            "lemin",
            "captcha_id",
            True,
            initial_wait=10.0,
            token_life=120.0,
            pipe_safe=False,
            optional=_TOKEN_EXTRAS | {"api_server"},
            required=frozenset({"div_id"}),
            answer="object",
            api_names={"api_server": "apiServer"},
        ),
    )
}

#: Parameters bound to one request: a token solved with them is useless to anyone else.
PER_REQUEST_PARAMS = frozenset(
    {"proxy", "proxytype", "userAgent", "cookies", "data-s", "body", "images"}
)


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
    params: Mapping[str, Param] = field(default_factory=dict)

    @property
    def spec(self) -> MethodSpec:
        return METHODS[self.method]

    @property
    def initial_wait(self) -> float:
        return default_wait(self.method, self.params)

    @property
    def returns_user_agent(self) -> bool:
        """Whether the answer comes with the user agent it must be used with (the
        Cloudflare challenge, CaptchaFox, reCAPTCHA Enterprise)."""
        if self.method == "userrecaptcha":
            return _truthy(self.params.get("enterprise"))
        return self.spec.user_agent

    @property
    def pipe_safe(self) -> bool:
        """Whether the answer can be asked for in a bulk (``ids=``) poll: a plain token
        without a user agent (a bulk reply has no room for one)."""
        return self.spec.pipe_safe and not self.returns_user_agent

    def api_fields(self) -> dict[str, Scalar]:
        """The ``in.php`` fields of this request (without the key)."""
        spec = self.spec
        data: dict[str, Scalar] = {"method": spec.wire_method}
        if spec.sitekey_field and self.sitekey is not None:
            data[spec.sitekey_field] = self.sitekey
        if self.pageurl is not None:
            data["pageurl"] = self.pageurl
        for name, value in self.params.items():
            if name in INTERNAL_PARAMS:
                continue
            if isinstance(value, list):
                data.update(_image_fields(value))
            else:
                data[spec.api_names.get(name, name)] = value
        return data

    def answer_value(self, value: Any) -> Any:
        """The answer as the method shapes it: JSON text becomes the object or list it
        holds.  Text that is not JSON of that shape is kept as the API sent it."""
        shape = self.spec.answer
        if shape == "text" or not isinstance(value, str):
            return value
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        expected = dict if shape == "object" else list
        return parsed if isinstance(parsed, expected) else value

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
    method: str | None = None,
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
    params = _renamed(params)
    _check_unknown(spec, params)  # first: `site_key=` must be named, not read as no sitekey
    if spec.sitekey_field is not None:
        sitekey = _required_text("sitekey", sitekey, method)
    elif sitekey is not None:
        raise ValidationError(f"method {method!r} takes no sitekey")
    if spec.needs_pageurl or pageurl is not None:
        pageurl = _check_pageurl(_required_text("pageurl", pageurl, method))
    clean = _check_params(spec, params)
    return SolveRequest(method, sitekey, pageurl, clean)


def _truthy(value: object) -> bool:
    return value not in (None, "", 0, "0", False, "false", "False")


def _renamed(params: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(params)
    for alias, name in _ALIASES.items():
        if alias not in out:
            continue
        value = out.pop(alias)
        if name in out and out[name] != value:
            raise ValidationError(f"{alias} and {name} are one parameter; give it once")
        out[name] = value
    return out


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


def _check_unknown(spec: MethodSpec, params: Mapping[str, Any]) -> None:
    unknown = set(params) - spec.optional - spec.required
    if not unknown:
        return
    hint = ""
    if spec.sitekey_field in unknown:
        hint = f" (method {spec.name!r} takes its {spec.sitekey_field} as sitekey)"
    known = sorted({"sitekey", "pageurl", *spec.optional, *spec.required})
    named = ", ".join(_with_guess(name, known) for name in sorted(unknown))
    raise ValidationError(f"unknown parameter(s) for method {spec.name!r}: {named}{hint}")


def _with_guess(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
    return f"{name} (did you mean {close[0]}?)" if close else name


def _check_names(spec: MethodSpec, params: Mapping[str, Any]) -> None:
    _check_unknown(spec, params)
    missing = spec.required - {k for k, v in params.items() if v not in (None, "")}
    if missing:
        raise ValidationError(
            f"missing parameter(s) for method {spec.name!r}: {', '.join(sorted(missing))}"
        )


def _check_params(spec: MethodSpec, params: Mapping[str, Any]) -> dict[str, Param]:
    _check_names(spec, params)
    clean: dict[str, Param] = {}
    for name, value in params.items():
        if value is None:
            continue
        clean[name] = _check_images(value) if name == "images" else _scalar(name, value)
    for name, value in spec.defaults.items():
        clean.setdefault(name, value)
    if "body" in clean:
        clean["body"] = _check_image(clean["body"])
    _check_values(spec, clean)
    _check_proxy(spec, clean)
    if "min_score" in clean:
        _check_min_score(clean["min_score"])
    return clean


def _check_values(spec: MethodSpec, clean: Mapping[str, Param]) -> None:
    for name, allowed in spec.choices.items():
        if name in clean and str(clean[name]) not in allowed:
            raise ValidationError(
                f"{name} must be one of {', '.join(sorted(allowed))} for method "
                f"{spec.name!r}, got {clean[name]!r}"
            )
    if "instructions" in clean and not str(clean["instructions"]).strip():
        raise ValidationError(f"instructions must not be blank for method {spec.name!r}")


def _check_proxy(spec: MethodSpec, clean: dict[str, Param]) -> None:
    allowed = ", ".join(sorted(spec.proxy_types))
    if "proxytype" in clean and str(clean["proxytype"]).upper() not in spec.proxy_types:
        raise ValidationError(
            f"proxytype must be one of {allowed} for method {spec.name!r}, "
            f"got {clean['proxytype']!r}"
        )
    # A proxy written with its type ("socks5://host:port"); never echoed: it may hold a password.
    scheme, sep, _ = str(clean.get("proxy", "")).partition("://")
    if sep and scheme.upper() in _PROXY_TYPES and scheme.upper() not in spec.proxy_types:
        raise ValidationError(
            f"method {spec.name!r} takes a proxy of proxytype {allowed} only, "
            f"not a {scheme.lower()}:// proxy"
        )
    if "proxy_owner" in clean and clean.get("proxy") != POOL_PROXY:
        raise ValidationError('proxy_owner goes with proxy="pool"')
    if "proxy" in clean and "proxytype" not in clean and clean["proxy"] != POOL_PROXY:
        clean["proxytype"] = "HTTP"


def _scalar(name: str, value: object) -> Scalar:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, bytes) and name == "body":
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, str | int | float):
        return value
    raise ValidationError(f"parameter {name!r} must be a string or number")


def _check_images(value: object) -> list[str]:
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise ValidationError(f"images must be a list of {BLS_IMAGES} images (base64 or bytes)")
    if len(value) != BLS_IMAGES:
        raise ValidationError(f"images must hold {BLS_IMAGES} images, got {len(value)}")
    images: list[str] = []
    for number, image in enumerate(value, start=1):
        if isinstance(image, bytes):
            image = base64.b64encode(image).decode("ascii")
        if not isinstance(image, str):
            raise ValidationError(f"image {number} must be base64 text or bytes")
        images.append(_check_image(image, f"image {number}"))
    return images


def _check_image(body: Param, what: str = "body") -> str:
    """Base64 image text (a ``data:`` URI's header dropped) whose bytes CaptchaAI accepts."""
    text = str(body)
    if text.startswith("data:") and "," in text:
        text = text.split(",", 1)[1]
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError(f"{what} must be base64-encoded image bytes") from None
    if len(raw) < MIN_IMAGE_BYTES:
        raise ValidationError(
            f"{what} is {len(raw)} bytes; the API needs at least {MIN_IMAGE_BYTES} bytes"
        )
    if len(raw) > MAX_IMAGE_BYTES:
        raise ValidationError(
            f"{what} is {len(raw)} bytes; the API accepts at most {MAX_IMAGE_BYTES} bytes"
        )
    if image_format(raw) is None:
        raise ValidationError(f"{what} is not a jpg, jpeg, png or gif image")
    return text


def image_format(raw: bytes) -> str | None:
    """``jpeg``, ``png`` or ``gif`` by the image's first bytes; None for anything else."""
    return next((name for magic, name in IMAGE_FORMATS.items() if raw.startswith(magic)), None)


def _image_fields(images: list[str]) -> dict[str, Scalar]:
    # CaptchaAI's BLS method takes each cell as a data URI, numbered from 1.
    fields: dict[str, Scalar] = {}
    for number, text in enumerate(images, start=1):
        kind = image_format(base64.b64decode(text[:16])) or "png"
        fields[f"image_base64_{number}"] = f"data:image/{kind};base64,{text}"
    return fields


def _check_min_score(value: Param) -> None:
    try:
        score = float(str(value))
    except ValueError:
        raise ValidationError("min_score must be a number between 0.1 and 0.9") from None
    if not 0.1 <= score <= 0.9:
        raise ValidationError("min_score must be between 0.1 and 0.9")

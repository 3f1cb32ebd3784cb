"""Token pool definitions: what a pool holds and how many, validated before use.

A pool is declared in ``CAPTCHAAI_POOLS`` (a JSON list, :func:`parse_pools`), with
``captcha_tasks.create_pool`` or ``captcha-tasks pool declare``; every problem is a
:class:`~captcha_tasks.errors.ConfigurationError` naming the pool and the field.  The
pools themselves (tokens, refills, counters) live in :mod:`captcha_tasks.state.pools`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigurationError, ValidationError
from ..methods import METHODS, PER_REQUEST_PARAMS, Param, Scalar, SolveRequest, build_request

__all__ = ["ENV_VAR", "POOLABLE_METHODS", "PoolSpec", "parse_pools"]

ENV_VAR = "CAPTCHAAI_POOLS"
#: Methods whose answer is a token reusable by anyone on the page.  GeeTest answers are
#: bound to one page load's ``challenge``, image captchas to one image, and the Cloudflare
#: challenge and CaptchaFox to one proxy.
POOLABLE_METHODS = frozenset({"userrecaptcha", "turnstile", "friendly_captcha"})

#: Request parameters that must be equal for a pooled token to fit a request.
_MATCH_PARAMS = ("action", "version", "min_score", "enterprise", "invisible", "data", "pagedata")
#: What an absent match parameter means to the API.
_PARAM_DEFAULTS = {("userrecaptcha", "version"): "v2", ("friendly_captcha", "version"): "v1"}
_FIELDS = ("name", "method", "sitekey", "pageurl", "size", "ttl", "min_remaining")
# Names go into key names and logs: keep them short and free of ':' and glob characters.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
_JSON_TYPES = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}


class _Invalid(Exception):
    """One problem with a pool definition; the caller adds which pool and where."""


@dataclass(frozen=True)
class PoolSpec:
    """One pool's definition.  Constructing it validates it (``ConfigurationError``)."""

    name: str
    method: str
    sitekey: str
    pageurl: str
    #: Most tokens to keep (the refill target never exceeds it).
    size: int
    #: Seconds a pooled token is usable after it is solved (the pool's own life).
    ttl: float
    #: A take only returns tokens with at least this many seconds of life left.
    min_remaining: float
    #: Method extras: ``action``, ``version``, ``min_score``, ``invisible``, ...
    params: Mapping[str, Scalar] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        try:
            request = _validate(self)
        except _Invalid as bad:
            raise ConfigurationError(f"pool {_label(self.name)}: {bad}") from None
        # Keep build_request's clean form (stripped, booleans as 0/1) so equal
        # definitions compare equal and match the requests build_request makes.
        object.__setattr__(self, "sitekey", request.sitekey)
        object.__setattr__(self, "pageurl", request.pageurl)
        object.__setattr__(self, "params", dict(request.params))
        object.__setattr__(self, "ttl", float(self.ttl))
        object.__setattr__(self, "min_remaining", float(self.min_remaining))

    def to_dict(self) -> dict[str, Any]:
        """The flat JSON form used by ``CAPTCHAAI_POOLS`` and the registry."""
        data: dict[str, Any] = {f: getattr(self, f) for f in _FIELDS}
        data.update(self.params)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None) -> PoolSpec:
        """Validate a flat definition; errors are prefixed with ``source`` when given."""
        try:
            return cls._from_mapping(data)
        except ConfigurationError as exc:
            if source is None:
                raise
            raise ConfigurationError(f"{source}: {exc.message}") from None

    @classmethod
    def _from_mapping(cls, data: object) -> PoolSpec:
        if not isinstance(data, Mapping):
            raise ConfigurationError(f"a pool must be a JSON object, not {_json_type(data)}")
        missing = [f for f in _FIELDS if data.get(f) is None]
        if missing:
            name = data.get("name")
            raise ConfigurationError(f"pool {_label(name)}: missing field(s) {', '.join(missing)}")
        extras = {k: v for k, v in data.items() if k not in _FIELDS}
        return cls(**{f: data[f] for f in _FIELDS}, params=extras)

    def matches(self, request: SolveRequest) -> bool:
        """Whether a token of this pool answers ``request``.

        Requests bound to a proxy, cookies, data-s, user agent or image never match:
        a token solved without them would be rejected by the site.
        """
        if request.per_request:
            return False
        if (request.method, request.sitekey, request.pageurl) != (
            self.method,
            self.sitekey,
            self.pageurl,
        ):
            return False
        return all(
            _match_value(self.method, k, self.params.get(k))
            == _match_value(request.method, k, request.params.get(k))
            for k in _MATCH_PARAMS
        )

    def solve_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``solve`` for one refill solve."""
        return {
            "method": self.method,
            "sitekey": self.sitekey,
            "pageurl": self.pageurl,
            **self.params,
        }


def parse_pools(text: str, source: str = ENV_VAR) -> tuple[PoolSpec, ...]:
    """Pools declared in ``CAPTCHAAI_POOLS`` (or a file, named by ``source``): a JSON list
    of flat pool objects.

    Blank means no pools.  Any problem raises ``ConfigurationError`` naming the variable
    (or file), the pool (item index, and name when known) and the field.
    """
    if not text or not text.strip():
        return ()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{source} is not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise ConfigurationError(
            f"{source} must be a JSON list of pool objects, not {_json_type(data)}"
        )
    specs: list[PoolSpec] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(data):
        where = f"{source} item #{index}"
        spec = PoolSpec.from_dict(item, source=where)
        if spec.name in seen:
            raise ConfigurationError(
                f"{where}: pool {spec.name!r}: name is a duplicate of item #{seen[spec.name]}"
            )
        seen[spec.name] = index
        specs.append(spec)
    return tuple(specs)


def _validate(spec: PoolSpec) -> SolveRequest:
    _check_name(spec.name)
    _check_method(spec.method)
    _check_size(spec.size)
    _check_life(spec.ttl, spec.min_remaining)
    return _check_request(spec)


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name.strip():
        raise _Invalid("name is missing or empty")
    if not _NAME_RE.fullmatch(name):
        raise _Invalid("name must be 1-64 letters, digits, '.', '_' or '-'")


def _check_method(method: object) -> None:
    if not isinstance(method, str) or method not in METHODS:
        raise _Invalid(f"method {method!r} is unknown; use one of {', '.join(sorted(METHODS))}")
    if method not in POOLABLE_METHODS:
        raise _Invalid(
            f"method {method!r} cannot be pooled (its answer is bound to one page load "
            f"or image); use one of {', '.join(sorted(POOLABLE_METHODS))}"
        )


def _check_size(size: object) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise _Invalid(f"size must be a positive integer, got {size!r}")


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Invalid(f"{name} must be a finite number of seconds, got {value!r}")
    return float(value)


def _check_life(ttl: object, min_remaining: object) -> None:
    ttl_s = _seconds("ttl", ttl)
    min_s = _seconds("min_remaining", min_remaining)
    if ttl_s <= 0:
        raise _Invalid(f"ttl must be > 0, got {ttl!r}")
    if min_s < 0:
        raise _Invalid(f"min_remaining must be >= 0, got {min_remaining!r}")
    if ttl_s <= min_s:
        raise _Invalid(
            f"ttl shorter than min_remaining: ttl ({ttl_s:g} s) must be longer than "
            f"min_remaining ({min_s:g} s) or no pooled token could ever be taken"
        )


def _check_request(spec: PoolSpec) -> SolveRequest:
    if not isinstance(spec.params, Mapping) or not all(isinstance(k, str) for k in spec.params):
        raise _Invalid("params must map parameter names to values")
    bound = sorted(set(spec.params) & PER_REQUEST_PARAMS)
    if bound:
        raise _Invalid(
            f"parameter(s) {', '.join(bound)} bind a token to one request; a pool cannot use them"
        )
    for name in ("sitekey", "pageurl"):
        value = getattr(spec, name)
        if not isinstance(value, str) or not value.strip():
            raise _Invalid(f"{name} must be a non-empty string, got {value!r}")
    try:
        return build_request(spec.method, spec.sitekey, spec.pageurl, **spec.params)
    except ValidationError as exc:
        # build_request names the field: "pageurl must be an http(s) URL", "unknown
        # parameter(s) for method 'turnstile': foo", "min_score must be ...".
        raise _Invalid(exc.message) from None


def _label(name: object) -> str:
    return repr(name) if isinstance(name, str) and name.strip() else "(unnamed)"


def _json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value), "number" if isinstance(value, int | float) else "value")


def _match_value(method: str, param: str, value: Param | None) -> str | None:
    if value is None:
        return _PARAM_DEFAULTS.get((method, param))
    return str(value)

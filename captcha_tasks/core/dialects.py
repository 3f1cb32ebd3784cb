"""The JSON family of captcha APIs (``createTask`` / ``getTaskResult``), one pure value per
provider: Anti-Captcha, CapSolver and CapMonster Cloud.

A :class:`Dialect` says how a :class:`~captcha_tasks.methods.SolveRequest` becomes a
``task`` object: the task type of each method and variant (:func:`variant_of`: reCAPTCHA
Enterprise, v3), with a proxy and without; the task field of each of our parameters; how a
proxy and cookies are written; which field of the account holds our app id, whether task
ids are integers or strings, the polling budgets and the provider's error codes
(:attr:`Dialect.errors`: code -> the in.php code whose class in :mod:`captcha_tasks.errors`
says what the caller does next).

A method (or variant) a dialect has no task type for is not taken by its providers: routing
asks :meth:`Dialect.supports` as it reads a provider's ``methods`` list.

Adding a JSON provider is one new :class:`Dialect` in :data:`DIALECTS` and its tests.
Pure values, no I/O.  The sandbox's JSON face reads :data:`DIALECTS` too:
:meth:`Dialect.key_of` maps a task back to our method and variant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import ValidationError
from ..methods import Param, SolveRequest

__all__ = [
    "ANTICAPTCHA",
    "CAPMONSTER",
    "CAPSOLVER",
    "COMMON_ERRORS",
    "DIALECTS",
    "VARIANTS",
    "Dialect",
    "TaskTypes",
    "build_task",
    "takes_callbacks",
    "describe",
    "parse_cookies",
    "proxy_fields",
    "proxy_string",
    "task_key",
    "variant_of",
]

IdType = Literal["int", "str"]
#: How a proxy is written in a task: the five ``proxy*`` fields, or one ``proxy`` string.
ProxyEncoding = Literal["fields", "string"]
#: How cookies are written: ``"a=1; b=2"``, or a list of ``{"name", "value"}`` objects.
CookieEncoding = Literal["string", "list"]

#: The variants of a method that take task types of their own (reCAPTCHA only).
VARIANTS: Mapping[str, tuple[str, ...]] = {
    "userrecaptcha": ("enterprise", "v3", "v3-enterprise"),
}


@dataclass(frozen=True)
class TaskTypes:
    """One method's task types: without a proxy and with one (None: not offered), and the
    fields every such task carries (``isEnterprise``, say)."""

    proxyless: str | None
    proxied: str | None = None
    fixed: Mapping[str, Any] = field(default_factory=dict)


#: Error codes the whole family shares, as the in.php code that classifies them.
COMMON_ERRORS: Mapping[str, str] = {
    "ERROR_KEY_DOES_NOT_EXIST": "ERROR_KEY_DOES_NOT_EXIST",
    "ERROR_ZERO_BALANCE": "ERROR_ZERO_BALANCE",
    "ERROR_NO_SLOT_AVAILABLE": "ERROR_NO_SLOT_AVAILABLE",
    "ERROR_CAPTCHA_UNSOLVABLE": "ERROR_CAPTCHA_UNSOLVABLE",
    "ERROR_TASK_ABSENT": "ERROR_BAD_PARAMETERS",
    "ERROR_TASK_NOT_SUPPORTED": "ERROR_BAD_PARAMETERS",
    "ERROR_NO_SUCH_CAPCHA_ID": "ERROR_WRONG_CAPTCHA_ID",
    "ERROR_WRONG_CAPTCHA_ID": "ERROR_WRONG_CAPTCHA_ID",
    "ERROR_IP_BLOCKED": "IP_BANNED",
    "ERROR_IP_NOT_ALLOWED": "ERROR_IP_NOT_ALLOWED",
    "ERROR_PROXY_CONNECT_REFUSED": "ERROR_PROXY_CONNECTION_FAILED",
    "ERROR_PROXY_CONNECT_TIMEOUT": "ERROR_PROXY_CONNECTION_FAILED",
    "ERROR_PROXY_READ_TIMEOUT": "ERROR_PROXY_CONNECTION_FAILED",
    "ERROR_PROXY_BANNED": "ERROR_BAD_PROXY",
    "ERROR_PROXY_TRANSPARENT": "ERROR_BAD_PROXY",
    "ERROR_PROXY_NOT_AUTHORISED": "ERROR_BAD_PROXY",
    "ERROR_RECAPTCHA_INVALID_SITEKEY": "ERROR_GOOGLEKEY",
    "ERROR_RECAPTCHA_INVALID_DOMAIN": "ERROR_PAGEURL",
    "ERROR_ZERO_CAPTCHA_FILESIZE": "ERROR_ZERO_CAPTCHA_FILESIZE",
    "ERROR_TOO_BIG_CAPTCHA_FILESIZE": "ERROR_TOO_BIG_CAPTCHA_FILESIZE",
    "ERROR_TOO_MUCH_REQUESTS": "ERROR_TOO_MUCH_REQUESTS",
}

#: Our parameter -> its task field, for every method of every dialect (a dialect's
#: ``method_fields`` add to it or rename; a dotted name is a field of an object).
COMMON_FIELDS: Mapping[str, str] = {
    "userAgent": "userAgent",
    "cookies": "cookies",
    "action": "pageAction",
    "min_score": "minScore",
    "data-s": "recaptchaDataSValue",
    "challenge": "challenge",
    "api_server": "geetestApiServerSubdomain",
}


@dataclass(frozen=True)
class Dialect:
    """How one JSON provider spells tasks, ids, answers and errors."""

    kind: str
    #: Task key (:func:`task_key`) -> its task types.  A key not here is not taken.
    task_types: Mapping[str, TaskTypes]
    #: The account field that carries our app id (``softId``, ``appId``).
    app_id_field: str
    id_type: IdType = "int"
    #: Seconds between two polls of one task, and polls allowed per task (None: no limit).
    poll_gap_s: float = 0.0
    polls_per_task: int | None = None
    #: Methods answered inside ``createTask`` (no poll).
    synchronous: frozenset[str] = frozenset()
    #: ``status`` values that mean "not ready yet".
    pending_statuses: frozenset[str] = frozenset({"processing"})
    #: The provider's error code -> the in.php code whose class says what to do next.
    errors: Mapping[str, str] = field(default_factory=lambda: dict(COMMON_ERRORS))
    #: The code it answers a task type it does not know with (one of :attr:`errors`).
    unsupported_code: str = "ERROR_TASK_NOT_SUPPORTED"
    #: Report endpoints: incorrect token, incorrect image, correct token (None: no such).
    report_bad_token: str | None = None
    report_bad_image: str | None = None
    report_good_token: str | None = None
    #: The ``createTask`` field that asks for a callback: the provider POSTs the task's
    #: ``getTaskResult`` JSON (with its ``taskId``) there when it is done (None: no
    #: callbacks; its captchas are polled).
    callback_field: str | None = "callbackUrl"
    #: Per method: our parameter -> its task field, beside :data:`COMMON_FIELDS`.
    method_fields: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    proxy_encoding: ProxyEncoding = "fields"
    cookie_encoding: CookieEncoding = "string"
    #: The only ``minScore`` values a v3 task may carry, when the provider has such a list
    #: (a v3 task always carries one: the smallest at or above the caller's).
    min_scores: tuple[float, ...] | None = None

    def types_for(self, method: str, variant: str = "") -> TaskTypes | None:
        return self.task_types.get(task_key(method, variant))

    def supports(self, method: str, proxied: bool = False, variant: str = "") -> bool:
        """Whether it has a task type for ``method`` in ``variant`` (with a proxy, when
        ``proxied``)."""
        types = self.types_for(method, variant)
        return types is not None and bool(types.proxied if proxied else types.proxyless)

    def fields(self, method: str) -> Mapping[str, str]:
        """Our parameter -> the task field, for ``method``."""
        return {**COMMON_FIELDS, **self.method_fields.get(method, {})}

    def key_of(self, task: Mapping[str, Any]) -> str | None:
        """The task key of a task object (the sandbox's JSON face): among the keys with its
        type, the one whose fixed fields it carries, the most specific first."""
        matches = [
            (len(types.fixed), key)
            for key, types in self.task_types.items()
            if task.get("type") in (types.proxyless, types.proxied)
            and all(task.get(k) == v for k, v in types.fixed.items())
        ]
        return max(matches)[1] if matches else None

    def method_of(self, task_type: str) -> str | None:
        """Our method for one of this dialect's task types."""
        key = self.key_of({"type": task_type})
        return None if key is None else key.partition(":")[0]

    def in_php_code(self, code: str) -> str:
        """The in.php code that classifies ``code`` (unknown codes pass through)."""
        return self.errors.get(code, code)


def task_key(method: str, variant: str = "") -> str:
    """The key of :attr:`Dialect.task_types` for ``method`` in ``variant``."""
    return f"{method}:{variant}" if variant else method


def variant_of(request: SolveRequest) -> str:
    """The variant of a request that takes task types of its own: ``enterprise``, ``v3``,
    ``v3-enterprise`` for reCAPTCHA, ``""`` otherwise."""
    if request.method != "userrecaptcha":
        return ""
    v3 = str(request.params.get("version", "")).lower() == "v3"
    enterprise = _truthy(request.params.get("enterprise"))
    return "-".join(part for part, on in (("v3", v3), ("enterprise", enterprise)) if on)


def describe(method: str, variant: str = "", proxied: bool = False) -> str:
    """``method 'userrecaptcha' (v3) with a proxy``, for messages."""
    what = f"method {method!r}" + (f" ({variant})" if variant else "")
    return what + (" with a proxy" if proxied else "")


def _truthy(value: object) -> bool:
    return value not in (None, "", 0, "0", False, "false", "False")


_IMAGE = TaskTypes("ImageToTextTask", None)
_IMAGE_FIELDS = {"regsense": "case", "numeric": "numeric", "calc": "math"}

ANTICAPTCHA = Dialect(
    kind="anticaptcha",
    task_types={
        "userrecaptcha": TaskTypes("RecaptchaV2TaskProxyless", "RecaptchaV2Task"),
        "userrecaptcha:enterprise": TaskTypes(
            "RecaptchaV2EnterpriseTaskProxyless", "RecaptchaV2EnterpriseTask"
        ),
        "userrecaptcha:v3": TaskTypes("RecaptchaV3TaskProxyless", None),
        "userrecaptcha:v3-enterprise": TaskTypes(
            "RecaptchaV3TaskProxyless", None, {"isEnterprise": True}
        ),
        "turnstile": TaskTypes("TurnstileTaskProxyless", "TurnstileTask"),
        "geetest": TaskTypes("GeeTestTaskProxyless", "GeeTestTask"),
        "base64": _IMAGE,
    },
    app_id_field="softId",
    # its workers are grouped by score; minScore is required and picks the group
    min_scores=(0.3, 0.7, 0.9),
    report_bad_token="reportIncorrectRecaptcha",
    report_bad_image="reportIncorrectImageCaptcha",
    report_good_token="reportCorrectRecaptcha",
    method_fields={
        "turnstile": {"action": "action", "data": "turnstileCData"},
        "base64": {
            **_IMAGE_FIELDS,
            "phrase": "phrase",
            "min_len": "minLength",
            "max_len": "maxLength",
            "textinstructions": "comment",
        },
    },
)
CAPSOLVER = Dialect(
    kind="capsolver",
    task_types={
        "userrecaptcha": TaskTypes("ReCaptchaV2TaskProxyLess", "ReCaptchaV2Task"),
        "userrecaptcha:enterprise": TaskTypes(
            "ReCaptchaV2EnterpriseTaskProxyLess", "ReCaptchaV2EnterpriseTask"
        ),
        "userrecaptcha:v3": TaskTypes("ReCaptchaV3TaskProxyLess", "ReCaptchaV3Task"),
        "userrecaptcha:v3-enterprise": TaskTypes(
            "ReCaptchaV3EnterpriseTaskProxyLess", "ReCaptchaV3EnterpriseTask"
        ),
        "turnstile": TaskTypes("AntiTurnstileTaskProxyLess", None),
        "geetest": TaskTypes("GeeTestTaskProxyLess", None),
        "base64": _IMAGE,
        # Cloudflare's challenge page: a proxy is required; the answer holds cf_clearance
        # and the user agent that goes with it.
        "cloudflare_challenge": TaskTypes(None, "AntiCloudflareTask"),
    },
    app_id_field="appId",
    id_type="str",
    polls_per_task=120,
    synchronous=frozenset({"base64"}),
    pending_statuses=frozenset({"processing", "idle"}),
    report_bad_token="feedbackTask",
    report_bad_image="feedbackTask",
    report_good_token="feedbackTask",
    method_fields={
        "turnstile": {"action": "metadata.action", "data": "metadata.cdata"},
        "base64": {"regsense": "case"},
    },
    proxy_encoding="string",
    cookie_encoding="list",
)
CAPMONSTER = Dialect(
    kind="capmonster",
    # CapMonster takes one type for both: the proxy fields are optional.
    task_types={
        "userrecaptcha": TaskTypes("RecaptchaV2Task", "RecaptchaV2Task"),
        "userrecaptcha:enterprise": TaskTypes(
            "RecaptchaV2EnterpriseTask", "RecaptchaV2EnterpriseTask"
        ),
        "userrecaptcha:v3": TaskTypes("RecaptchaV3TaskProxyless", None),
        "userrecaptcha:v3-enterprise": TaskTypes("RecaptchaV3EnterpriseTask", None),
        "turnstile": TaskTypes("TurnstileTask", "TurnstileTask"),
        "geetest": TaskTypes("GeeTestTask", "GeeTestTask"),
        "base64": _IMAGE,
    },
    app_id_field="softId",
    poll_gap_s=2.0,
    polls_per_task=120,
    method_fields={
        "turnstile": {"action": "pageAction", "data": "data", "pagedata": "pageData"},
        "base64": _IMAGE_FIELDS,
    },
)

#: Every JSON dialect by its provider kind.
DIALECTS: Mapping[str, Dialect] = {d.kind: d for d in (ANTICAPTCHA, CAPSOLVER, CAPMONSTER)}


def takes_callbacks(kind: str) -> bool:
    """Whether a provider of ``kind`` calls back when a captcha is done: every in.php kind
    (``pingback``), and each JSON kind whose dialect has a :attr:`Dialect.callback_field`."""
    dialect = DIALECTS.get(kind)
    return dialect is None or dialect.callback_field is not None


def build_task(dialect: Dialect, request: SolveRequest) -> dict[str, Any]:
    """The ``task`` object of ``createTask`` for ``request`` in ``dialect``.  Parameters
    the dialect has no field for are not sent."""
    variant = variant_of(request)
    types = dialect.types_for(request.method, variant)
    proxy = request.params.get("proxy")
    task_type = types and (types.proxied if proxy else types.proxyless)
    if not types or not task_type:
        what = describe(request.method, variant, bool(proxy))
        raise ValidationError(f"{dialect.kind} has no task type for {what}")
    task: dict[str, Any] = {"type": task_type, **types.fixed}
    if request.method == "base64":
        task["body"] = request.params.get("body")
    else:
        task["websiteURL"] = request.pageurl
        if request.sitekey is not None:
            task["gt" if request.method == "geetest" else "websiteKey"] = request.sitekey
    if _truthy(request.params.get("invisible")):
        task["isInvisible"] = True
    for name, value in request.params.items():
        task_field = dialect.fields(request.method).get(name)
        if task_field is not None:
            _put(task, task_field, _task_value(dialect, name, value))
    if dialect.min_scores and variant.startswith("v3"):
        task["minScore"] = _min_score(task.get("minScore"), dialect.min_scores)
    if isinstance(proxy, str) and proxy:
        proxytype = str(request.params.get("proxytype", "HTTP"))
        if dialect.proxy_encoding == "string":
            task["proxy"] = proxy_string(proxy, proxytype)
        else:
            task.update(proxy_fields(proxy, proxytype))
    return task


def _min_score(asked: Any, allowed: tuple[float, ...]) -> float:
    wanted = asked if isinstance(asked, float | int) else allowed[0]
    return next((score for score in allowed if score >= wanted), allowed[-1])


def _put(task: dict[str, Any], name: str, value: Any) -> None:
    outer, dot, inner = name.partition(".")
    if dot:
        task.setdefault(outer, {})[inner] = value
    else:
        task[name] = value


def _number(kind: Callable[[str], Any]) -> Callable[[Param], Any]:
    def convert(value: Param) -> Any:
        try:
            return kind(str(value))
        except ValueError:
            return value

    return convert


#: Parameters whose task field is not text.
_CONVERT: Mapping[str, Callable[[Param], Any]] = {
    "min_score": _number(float),
    "numeric": _number(int),
    "min_len": _number(int),
    "max_len": _number(int),
    "regsense": _truthy,
    "calc": _truthy,
    "phrase": _truthy,
}


def _task_value(dialect: Dialect, name: str, value: Param) -> Any:
    if name == "cookies":
        pairs = parse_cookies(str(value))
        if dialect.cookie_encoding == "list":
            return [{"name": k, "value": v} for k, v in pairs]
        return "; ".join(f"{k}={v}" for k, v in pairs)
    convert = _CONVERT.get(name)
    return value if convert is None else convert(value)


def parse_cookies(text: str) -> list[tuple[str, str]]:
    """Cookies as CaptchaAI takes them (``a:1;b:2``), or as a header (``a=1; b=2``), as
    (name, value) pairs."""
    pairs = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        cut = min((i for i in (part.find("="), part.find(":")) if i > 0), default=-1)
        if cut < 0:
            raise ValidationError("cookies must be name:value pairs separated by ';'")
        pairs.append((part[:cut].strip(), part[cut + 1 :].strip()))
    return pairs


def _split_proxy(proxy: str, proxytype: str) -> tuple[str, str, int, str, str | None]:
    """(type, host, port, login, password) of ``[type://][login:password@]host:port``."""
    scheme, sep, rest = proxy.partition("://")
    if sep:
        proxytype, proxy = scheme, rest
    credentials, _, address = proxy.rpartition("@")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        # never the value: it may hold the proxy's password
        raise ValidationError("proxy must be host:port or login:password@host:port")
    login, colon, password = credentials.partition(":")
    return proxytype.lower(), host, int(port), login, password if colon else None


def proxy_fields(proxy: str, proxytype: str) -> dict[str, Any]:
    """``login:password@host:port`` (or ``host:port``) as the family's proxy fields."""
    kind, host, port, login, password = _split_proxy(proxy, proxytype)
    fields: dict[str, Any] = {"proxyType": kind, "proxyAddress": host, "proxyPort": port}
    if login:
        fields.update(proxyLogin=login, proxyPassword=password or "")
    return fields


def proxy_string(proxy: str, proxytype: str) -> str:
    """The proxy as CapSolver's one ``proxy`` string: ``type:host:port[:login:password]``."""
    kind, host, port, login, password = _split_proxy(proxy, proxytype)
    text = f"{kind}:{host}:{port}"
    return f"{text}:{login}:{password or ''}" if login else text

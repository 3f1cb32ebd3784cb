"""The JSON family of captcha APIs (``createTask`` / ``getTaskResult``), one pure value per
provider: Anti-Captcha, CapSolver and CapMonster Cloud.

A :class:`Dialect` says how a :class:`~captcha_tasks.methods.SolveRequest` becomes a
``task`` object (the task type of each method, proxy and proxyless), which field of the
account holds our app id, whether task ids are integers or strings, the polling budgets and
the provider's error codes (:attr:`Dialect.errors`: code -> the in.php code whose class in
:mod:`captcha_tasks.errors` says what the caller does next).

Adding a JSON provider is one new :class:`Dialect` in :data:`DIALECTS` and its tests.
Pure values, no I/O.  The gateway's JSON face reads :data:`DIALECTS` too:
:meth:`Dialect.method_of` maps a task type back to our method.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import ValidationError
from ..methods import SolveRequest

__all__ = [
    "ANTICAPTCHA",
    "CAPMONSTER",
    "CAPSOLVER",
    "COMMON_ERRORS",
    "DIALECTS",
    "Dialect",
    "TaskTypes",
    "build_task",
    "takes_callbacks",
]

IdType = Literal["int", "str"]


@dataclass(frozen=True)
class TaskTypes:
    """One method's task types: without a proxy and with one (None: not offered)."""

    proxyless: str | None
    proxied: str | None = None


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


@dataclass(frozen=True)
class Dialect:
    """How one JSON provider spells tasks, ids, answers and errors."""

    kind: str
    #: Our method -> its task types.  A method not here is not taken by the provider.
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
    #: Report endpoints: incorrect token, incorrect image, correct token (None: no such).
    report_bad_token: str | None = None
    report_bad_image: str | None = None
    report_good_token: str | None = None
    #: The ``createTask`` field that asks for a callback: the provider POSTs the task's
    #: ``getTaskResult`` JSON (with its ``taskId``) there when it is done (None: no
    #: callbacks; its captchas are polled).
    callback_field: str | None = "callbackUrl"

    def supports(self, method: str, proxied: bool = False) -> bool:
        """Whether it has a task type for ``method`` (with a proxy, when ``proxied``)."""
        types = self.task_types.get(method)
        return types is not None and bool(types.proxied if proxied else types.proxyless)

    def method_of(self, task_type: str) -> str | None:
        """Our method for one of this dialect's task types (the gateway's JSON face)."""
        for method, types in self.task_types.items():
            if task_type in (types.proxyless, types.proxied):
                return method
        return None

    def in_php_code(self, code: str) -> str:
        """The in.php code that classifies ``code`` (unknown codes pass through)."""
        return self.errors.get(code, code)


_IMAGE = TaskTypes("ImageToTextTask", None)

ANTICAPTCHA = Dialect(
    kind="anticaptcha",
    task_types={
        "userrecaptcha": TaskTypes("RecaptchaV2TaskProxyless", "RecaptchaV2Task"),
        "turnstile": TaskTypes("TurnstileTaskProxyless", "TurnstileTask"),
        "geetest": TaskTypes("GeeTestTaskProxyless", "GeeTestTask"),
        "base64": _IMAGE,
    },
    app_id_field="softId",
    report_bad_token="reportIncorrectRecaptcha",
    report_bad_image="reportIncorrectImageCaptcha",
    report_good_token="reportCorrectRecaptcha",
)
CAPSOLVER = Dialect(
    kind="capsolver",
    task_types={
        "userrecaptcha": TaskTypes("ReCaptchaV2TaskProxyLess", "ReCaptchaV2Task"),
        "turnstile": TaskTypes("AntiTurnstileTaskProxyLess", None),
        "geetest": TaskTypes("GeeTestTaskProxyLess", None),
        "base64": _IMAGE,
    },
    app_id_field="appId",
    id_type="str",
    polls_per_task=120,
    synchronous=frozenset({"base64"}),
    pending_statuses=frozenset({"processing", "idle"}),
    report_bad_token="feedbackTask",
    report_bad_image="feedbackTask",
    report_good_token="feedbackTask",
)
CAPMONSTER = Dialect(
    kind="capmonster",
    # CapMonster takes one type for both: the proxy fields are optional.
    task_types={
        "userrecaptcha": TaskTypes("RecaptchaV2Task", "RecaptchaV2Task"),
        "turnstile": TaskTypes("TurnstileTask", "TurnstileTask"),
        "geetest": TaskTypes("GeeTestTask", "GeeTestTask"),
        "base64": _IMAGE,
    },
    app_id_field="softId",
    poll_gap_s=2.0,
    polls_per_task=120,
)

#: Every JSON dialect by its provider kind.
DIALECTS: Mapping[str, Dialect] = {d.kind: d for d in (ANTICAPTCHA, CAPSOLVER, CAPMONSTER)}


def takes_callbacks(kind: str) -> bool:
    """Whether a provider of ``kind`` calls back when a captcha is done: every in.php kind
    (``pingback``), and each JSON kind whose dialect has a :attr:`Dialect.callback_field`."""
    dialect = DIALECTS.get(kind)
    return dialect is None or dialect.callback_field is not None


#: Our parameter -> the task field (for the parameters whose name differs).
_TASK_FIELDS = {
    "userAgent": "userAgent",
    "cookies": "cookies",
    "action": "pageAction",
    "data": "data",
    "pagedata": "pagedata",
    "min_score": "minScore",
    "challenge": "challenge",
    "api_server": "geetestApiServerSubdomain",
    "data-s": "recaptchaDataSValue",
}


def build_task(dialect: Dialect, request: SolveRequest) -> dict[str, Any]:
    """The ``task`` object of ``createTask`` for ``request`` in ``dialect``."""
    types = dialect.task_types.get(request.method)
    proxy = request.params.get("proxy")
    task_type = types and (types.proxied if proxy else types.proxyless)
    if not task_type:
        what = "with a proxy" if proxy else "without a proxy"
        raise ValidationError(f"{dialect.kind} does not take method {request.method!r} {what}")
    task: dict[str, Any] = {"type": task_type}
    if request.method == "base64":
        task["body"] = request.params.get("body")
        return task
    task["websiteURL"] = request.pageurl
    key_field = "gt" if request.method == "geetest" else "websiteKey"
    task[key_field] = request.sitekey
    if request.params.get("invisible") in (1, "1", True):
        task["isInvisible"] = True
    for name, value in request.params.items():
        if name in _TASK_FIELDS:
            task[_TASK_FIELDS[name]] = value
    if isinstance(proxy, str) and proxy:
        task.update(proxy_fields(proxy, str(request.params.get("proxytype", "HTTP"))))
    return task


def proxy_fields(proxy: str, proxytype: str) -> dict[str, Any]:
    """``login:password@host:port`` (or ``host:port``) as the family's proxy fields."""
    credentials, _, address = proxy.rpartition("@")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        # never the value: it may hold the proxy's password
        raise ValidationError("proxy must be host:port or login:password@host:port")
    fields: dict[str, Any] = {
        "proxyType": proxytype.lower(),
        "proxyAddress": host,
        "proxyPort": int(port),
    }
    if credentials:
        login, _, password = credentials.partition(":")
        fields.update(proxyLogin=login, proxyPassword=password)
    return fields

"""The JSON face's task types (Anti-Captcha and CapMonster names, CapSolver's where they
differ) and the ``solve`` method each one is, in one table: :data:`TASK_TYPES`.

Each type says which of its task's fields become which ``solve`` parameter, what it
implies (``version="v3"``, ``enterprise=1``) and the shape of its ``solution``.  Proxy
fields (``proxyType``, ``proxyAddress``, ``proxyPort``, ``proxyLogin``,
``proxyPassword``) become ``proxy`` and ``proxytype`` for every type.

This is the one place that maps task types to methods in the gateway; a provider that
speaks the JSON protocol upstream keeps its own table (to be merged with this one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Fields every task may carry that mean nothing to a solve.
IGNORED = frozenset({"type", "nocache", "apiDomain", "softId", "isSession"})
PROXY_FIELDS = ("proxyType", "proxyAddress", "proxyPort", "proxyLogin", "proxyPassword")


@dataclass(frozen=True)
class TaskType:
    method: str
    #: task field -> solve parameter (None: taken, and of no use to a solve)
    fields: Mapping[str, str | None]
    #: What the type itself says (``version``, ``enterprise``).
    implied: Mapping[str, Any] = field(default_factory=dict)


#: The shape of a method's ``solution`` (others: ``{"token": ...}``): ``gRecaptchaResponse``,
#: ``text``, GeeTest's ``challenge`` / ``validate`` / ``seccode``, or the answer's object.
SOLUTIONS = {"userrecaptcha": "recaptcha", "base64": "text", "geetest": "geetest"}


_SITE = {"websiteURL": "pageurl", "websiteKey": "sitekey", "userAgent": "userAgent"}
_RECAPTCHA = {
    **_SITE,
    "isInvisible": "invisible",
    "recaptchaDataSValue": "data-s",
    "cookies": "cookies",
}
_V3 = {**_SITE, "minScore": "min_score", "pageAction": "action", "isEnterprise": "enterprise"}
_TURNSTILE = {
    **_SITE,
    "action": "action",
    "pageAction": "action",
    "cData": "data",
    "data": "data",
    "chlPageData": "pagedata",
    "pageData": "pagedata",
}
_GEETEST: dict[str, str | None] = {
    "version": None,  # CapMonster sends 3 (GeeTest v3 is what the method solves)
    "websiteURL": "pageurl",
    "gt": "sitekey",
    "challenge": "challenge",
    "geetestApiServerSubdomain": "api_server",
    "userAgent": "userAgent",
}
_IMAGE: dict[str, str | None] = {
    "recognizingThreshold": None,  # CapMonster's own hints
    "CapMonsterModule": None,
    "Case": "regsense",
    "body": "body",
    "numeric": "numeric",
    "minLength": "min_len",
    "maxLength": "max_len",
    "phrase": "phrase",
    "case": "regsense",
    "math": "calc",
    "comment": "textinstructions",
}
_LEMIN = {
    "websiteURL": "pageurl",
    "captchaId": "sitekey",
    "divId": "div_id",
    "leminApiServerSubdomain": "api_server",
    "userAgent": "userAgent",
}


def _both(names: tuple[str, ...], kind: TaskType) -> dict[str, TaskType]:
    return {name: kind for name in names}


TASK_TYPES: dict[str, TaskType] = {
    **_both(
        (
            "RecaptchaV2Task",
            "RecaptchaV2TaskProxyless",
            "NoCaptchaTask",
            "NoCaptchaTaskProxyless",
            "ReCaptchaV2Task",
            "ReCaptchaV2TaskProxyLess",
        ),
        TaskType("userrecaptcha", _RECAPTCHA),
    ),
    **_both(
        (
            "RecaptchaV2EnterpriseTask",
            "RecaptchaV2EnterpriseTaskProxyless",
            "ReCaptchaV2EnterpriseTask",
            "ReCaptchaV2EnterpriseTaskProxyLess",
        ),
        TaskType("userrecaptcha", _RECAPTCHA, {"enterprise": 1}),
    ),
    **_both(
        (
            "RecaptchaV3Task",
            "RecaptchaV3TaskProxyless",
            "ReCaptchaV3Task",
            "ReCaptchaV3TaskProxyLess",
        ),
        TaskType("userrecaptcha", _V3, {"version": "v3"}),
    ),
    **_both(
        (
            "RecaptchaV3EnterpriseTask",
            "ReCaptchaV3EnterpriseTask",
            "ReCaptchaV3EnterpriseTaskProxyLess",
        ),
        TaskType("userrecaptcha", _V3, {"version": "v3", "enterprise": 1}),
    ),
    **_both(
        ("TurnstileTask", "TurnstileTaskProxyless", "AntiTurnstileTaskProxyLess"),
        TaskType("turnstile", _TURNSTILE),
    ),
    **_both(("GeeTestTask", "GeeTestTaskProxyless"), TaskType("geetest", _GEETEST)),
    "ImageToTextTask": TaskType("base64", _IMAGE),
    **_both(
        ("FriendlyCaptchaTask", "FriendlyCaptchaTaskProxyless"),
        TaskType("friendly_captcha", {**_SITE, "version": "version"}),
    ),
    **_both(("LeminTask", "LeminTaskProxyless"), TaskType("lemin", _LEMIN)),
    "AntiCloudflareTask": TaskType(
        "cloudflare_challenge", {"websiteURL": "pageurl", "userAgent": "userAgent"}
    ),
    "CaptchaFoxTask": TaskType("captchafox", _SITE),
}


class BadTask(ValueError):
    """A task the table cannot read: ``code`` is the protocol's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def solve_kwargs(task: Any) -> dict[str, Any]:
    """``solve``'s keyword arguments for a JSON ``task`` object; :class:`BadTask` names
    what is wrong (an unknown type, an unknown field)."""
    if not isinstance(task, dict):
        raise BadTask("ERROR_TASK_ABSENT", "task must be a JSON object")
    name = task.get("type")
    kind = TASK_TYPES.get(name) if isinstance(name, str) else None
    if kind is None:
        raise BadTask("ERROR_TASK_NOT_SUPPORTED", f"unknown task type {str(name)[:60]!r}")
    unknown = sorted(set(task) - set(kind.fields) - IGNORED - set(PROXY_FIELDS) - {"proxy"})
    if unknown:
        raise BadTask(
            "ERROR_INVALID_TASK_DATA",
            f"{name} takes no field(s) {', '.join(u[:40] for u in unknown[:5])}",
        )
    if kind.method == "geetest" and str(task.get("version", 3)) != "3":
        raise BadTask("ERROR_INVALID_TASK_DATA", "only GeeTest v3 is solved here (version 3)")
    kwargs: dict[str, Any] = {"method": kind.method, **kind.implied}
    for source, target in kind.fields.items():
        if target is not None and task.get(source) is not None:
            kwargs[target] = _value(task[source])
    kwargs.update(_proxy(task))
    return kwargs


def _value(value: Any) -> Any:
    return int(value) if isinstance(value, bool) else value


def _proxy(task: Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(task.get("proxy"), str):  # CapSolver: one string
        return {"proxy": task["proxy"]}
    address, port = task.get("proxyAddress"), task.get("proxyPort")
    if not address:
        return {}
    login, password = task.get("proxyLogin"), task.get("proxyPassword")
    auth = f"{login}:{password}@" if login else ""
    proxy = {"proxy": f"{auth}{address}:{port}"}
    if task.get("proxyType"):
        proxy["proxytype"] = str(task["proxyType"]).upper()
    return proxy


def solution(method: str, token: Any, user_agent: str | None) -> dict[str, Any]:
    """The ``solution`` object of a solved task of ``method``."""
    kind = SOLUTIONS.get(method, "token")
    found: dict[str, Any]
    if kind == "recaptcha":
        found = {"gRecaptchaResponse": token}
    elif kind == "text":
        found = {"text": token}
    elif kind == "geetest" and isinstance(token, dict):
        found = {
            "challenge": token.get("geetest_challenge"),
            "validate": token.get("geetest_validate"),
            "seccode": token.get("geetest_seccode"),
        }
    elif isinstance(token, dict):
        found = dict(token)
    else:
        found = {"token": token}
    if user_agent is not None:
        found["userAgent"] = user_agent
    return found

"""The sandbox's JSON face: ``createTask`` / ``getTaskResult`` / ``getBalance`` and the
report endpoints of one :class:`~captcha_tasks.core.dialects.Dialect`.

Each request is checked the way the provider checks it (a missing ``clientKey`` or ``task``,
a task type the dialect does not know: ``ERROR_TASK_NOT_SUPPORTED``; integer ids where the
provider issues integers) and then answered by the sandbox's in.php logic, so threads,
balance, unsolvable captchas, injected errors and outages behave as on the in.php face.
A task created with a ``callbackUrl`` is called back as the providers do: a POST of its
``getTaskResult`` JSON, with its ``taskId`` (:func:`callback_body`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from ..core.dialects import Dialect

#: The endpoints a JSON provider answers (without the leading slash).
JSON_ENDPOINTS = frozenset(
    {
        "createTask",
        "getTaskResult",
        "getBalance",
        "reportIncorrectRecaptcha",
        "reportIncorrectImageCaptcha",
        "reportCorrectRecaptcha",
        "feedbackTask",
    }
)

#: in.php codes -> the family's codes.
_CODES = {
    "ERROR_WRONG_USER_KEY": "ERROR_KEY_DOES_NOT_EXIST",
    "ERROR_WRONG_CAPTCHA_ID": "ERROR_NO_SUCH_CAPCHA_ID",
    "ERROR_GOOGLEKEY": "ERROR_RECAPTCHA_INVALID_SITEKEY",
    "ERROR_PAGEURL": "ERROR_RECAPTCHA_INVALID_DOMAIN",
    "ERROR_PROXY_CONNECTION_FAILED": "ERROR_PROXY_CONNECT_REFUSED",
    "ERROR_BAD_PARAMETERS": "ERROR_TASK_ABSENT",
}
#: What a solved task costs, for the dialects whose getTaskResult says (Anti-Captcha's).
COSTS = {"anticaptcha": "0.00095"}
#: Where each method's answer goes in ``solution``.
_SOLUTION_FIELD = {"userrecaptcha": "gRecaptchaResponse", "turnstile": "token", "base64": "text"}
#: The in.php field that receives a task's ``websiteKey`` (or GeeTest's ``gt``).
_SITEKEY_PARAM = {"userrecaptcha": "googlekey", "turnstile": "sitekey", "geetest": "gt"}
_PROXY_TYPES = ("http", "https", "socks4", "socks5")


class _Reply(Protocol):
    status: int
    body: bytes


class _State(Protocol):
    def in_php(self, params: Mapping[str, str]) -> Any: ...
    def res_php(self, params: Mapping[str, str]) -> Any: ...
    def method_of(self, captcha_id: str) -> str | None: ...


def _error(code: str) -> dict[str, Any]:
    code = _CODES.get(code, code)
    return {"errorId": 1, "errorCode": code, "errorDescription": code}


def _reply_data(reply: _Reply) -> dict[str, Any] | None:
    try:
        data = json.loads(reply.body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def json_call(state: _State, dialect: Dialect, endpoint: str, body: bytes) -> dict[str, Any]:
    """One JSON request's reply object."""
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return _error("ERROR_TASK_ABSENT")
    if not isinstance(data, dict):
        return _error("ERROR_TASK_ABSENT")
    key = data.get("clientKey")
    if not isinstance(key, str) or not key:
        return _error("ERROR_KEY_DOES_NOT_EXIST")
    if endpoint == "createTask":
        callback = data.get(dialect.callback_field) if dialect.callback_field else None
        return _create(state, dialect, key, data.get("task"), callback)
    if endpoint == "getTaskResult":
        return _result(state, dialect, key, data.get("taskId"))
    if endpoint == "getBalance":
        reply = _reply_data(state.res_php({"key": key, "action": "getbalance", "json": "1"}))
        if reply is None or reply.get("status") != 1:
            return _error(str((reply or {}).get("request", "ERROR_SERVER_ERROR")))
        return {"errorId": 0, "balance": float(reply["request"])}
    return _report(state, dialect, key, endpoint, data)


def _task_params(dialect: Dialect, task: Any) -> dict[str, str] | dict[str, Any]:
    """A task object as the in.php parameters of its method (or the provider's error)."""
    if not isinstance(task, dict) or not isinstance(task.get("type"), str):
        return _error("ERROR_TASK_ABSENT")
    key = dialect.key_of(task)
    if key is None:
        return _error(dialect.unsupported_code)
    method, _, variant = key.partition(":")
    types = dialect.task_types[key]
    proxy = _proxy_params(dialect, task)
    if task["type"] == types.proxied and types.proxied != types.proxyless and not proxy:
        return _error("ERROR_TASK_ABSENT")
    params = {"method": method, **_variant_params(variant), **proxy}
    if "websiteURL" in task:
        params["pageurl"] = str(task["websiteURL"])
    if method in _SITEKEY_PARAM:
        params[_SITEKEY_PARAM[method]] = str(
            task.get("gt" if method == "geetest" else "websiteKey", "")
        )
    if "body" in task:
        params["body"] = str(task["body"])
    if task.get("isInvisible"):
        params["invisible"] = "1"
    for param, name in dialect.fields(method).items():
        value = _field(task, name)
        if value is not None:
            params[param] = _cookies_text(value) if param == "cookies" else _param_text(value)
    return params


def _variant_params(variant: str) -> dict[str, str]:
    params = {}
    if "v3" in variant:
        params["version"] = "v3"
    if "enterprise" in variant:
        params["enterprise"] = "1"
    return params


def _field(task: Mapping[str, Any], name: str) -> Any:
    outer, dot, inner = name.partition(".")
    value = task.get(outer)
    if dot:
        return value.get(inner) if isinstance(value, Mapping) else None
    return value


def _param_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _cookies_text(value: Any) -> str:
    """Cookies (``a=1; b=2``, or CapSolver's list of objects) as CaptchaAI writes them."""
    if isinstance(value, list):
        return ";".join(f"{c.get('name')}:{c.get('value')}" for c in value if isinstance(c, dict))
    return ";".join(p.strip().replace("=", ":", 1) for p in str(value).split(";") if p.strip())


def _proxy_params(dialect: Dialect, task: Mapping[str, Any]) -> dict[str, str]:
    """The proxy of a task as in.php's ``proxy`` and ``proxytype`` (none: empty)."""
    if dialect.proxy_encoding == "string":
        return _proxy_string_params(str(task.get("proxy") or ""))
    if not task.get("proxyAddress"):
        return {}
    login = (
        f"{task['proxyLogin']}:{task.get('proxyPassword', '')}@" if task.get("proxyLogin") else ""
    )
    return {
        "proxy": f"{login}{task['proxyAddress']}:{task.get('proxyPort', '')}",
        "proxytype": str(task.get("proxyType", "http")).upper(),
    }


def _proxy_string_params(text: str) -> dict[str, str]:
    parts = text.split(":")
    kind = parts.pop(0) if parts and parts[0].lower() in _PROXY_TYPES else "http"
    if len(parts) < 2:
        return {}
    address = f"{parts[0]}:{parts[1]}"
    if len(parts) > 2:
        address = f"{parts[2]}:{':'.join(parts[3:])}@{address}"
    return {"proxy": address, "proxytype": kind.upper()}


def _create(
    state: _State, dialect: Dialect, key: str, task: Any, callback: Any = None
) -> dict[str, Any]:
    params = _task_params(dialect, task)
    if "errorId" in params:
        return params
    if isinstance(callback, str) and callback.strip():
        params["pingback"] = callback.strip()  # called back as the provider does
    reply = _reply_data(state.in_php({**params, "key": key, "json": "1"}))
    if reply is None:
        return _error("ERROR_SERVER_ERROR")
    if reply.get("status") != 1:
        return _error(str(reply.get("request")))
    captcha_id = str(reply["request"])
    task_id: int | str = int(captcha_id) if dialect.id_type == "int" else _uuid_of(captcha_id)
    created: dict[str, Any] = {"errorId": 0, "taskId": task_id}
    if params["method"] in dialect.synchronous:
        # CapSolver answers images inside createTask (the sandbox solves them at once
        # only if solve_time is 0; otherwise the answer comes on the first poll).
        result = _result(state, dialect, key, task_id)
        if result.get("status") == "ready":
            created.update(status="ready", solution=result["solution"])
    return created


#: CapSolver issues uuids: the sandbox's numeric id is kept in the uuid's last field.
def _uuid_of(captcha_id: str) -> str:
    return str(uuid.UUID(int=int(captcha_id)))


def sandbox_id(dialect: Dialect, task_id: str) -> str | None:
    """The sandbox's own captcha id of a task id as a client holds it (text)."""
    return _captcha_id(dialect, int(task_id) if dialect.id_type == "int" else task_id)


def _captcha_id(dialect: Dialect, task_id: Any) -> str | None:
    if dialect.id_type == "int":
        return str(task_id) if isinstance(task_id, int) and not isinstance(task_id, bool) else None
    if not isinstance(task_id, str):
        return None
    try:
        return str(uuid.UUID(task_id).int)
    except ValueError:
        return None


def _result(state: _State, dialect: Dialect, key: str, task_id: Any) -> dict[str, Any]:
    captcha_id = _captcha_id(dialect, task_id)
    if captcha_id is None:
        return _error("ERROR_WRONG_CAPTCHA_ID")
    reply = _reply_data(state.res_php({"key": key, "action": "get", "id": captcha_id, "json": "1"}))
    if reply is None:
        return _error("ERROR_SERVER_ERROR")
    if reply.get("status") != 1:
        code = str(reply.get("request"))
        if code == "CAPCHA_NOT_READY":
            return {"errorId": 0, "status": "processing"}
        return _error(code)
    ready = {"errorId": 0, "status": "ready", "solution": _solution(state, captcha_id, reply)}
    if dialect.kind in COSTS:
        ready["cost"] = COSTS[dialect.kind]
    return ready


def _solution(state: _State, captcha_id: str, reply: Mapping[str, Any]) -> dict[str, Any]:
    """The answer as the family writes it: GeeTest's fields without in.php's ``geetest_``,
    the Cloudflare challenge's cf_clearance among ``cookies`` (CapSolver's
    AntiCloudflareTask), with the user agent where the sandbox answers with one."""
    answer = reply.get("result") or reply.get("request")
    return _solution_of(state.method_of(captcha_id) or "", answer, reply.get("user_agent"))


def _solution_of(method: str, answer: Any, agent: Any) -> dict[str, Any]:
    solution: dict[str, Any]
    if isinstance(answer, dict):
        solution = {k.removeprefix("geetest_"): v for k, v in answer.items()}
    elif method == "cloudflare_challenge":
        solution = {"cookies": {"cf_clearance": answer}}
    else:
        solution = {_SOLUTION_FIELD.get(method, "token"): answer}
    if isinstance(agent, str):
        solution["userAgent"] = agent
    return solution


def callback_body(
    dialect: Dialect,
    captcha_id: str,
    method: str,
    answer: Any,
    error: str | None,
    agent: str | None = None,
) -> str:
    """What the provider POSTs to a task's ``callbackUrl`` when it is done: the task's
    ``getTaskResult`` reply, with its ``taskId``."""
    task_id: int | str = int(captcha_id) if dialect.id_type == "int" else _uuid_of(captcha_id)
    if error is not None:
        return json.dumps({**_error(error), "taskId": task_id})
    body = {
        "errorId": 0,
        "taskId": task_id,
        "status": "ready",
        "solution": _solution_of(method, answer, agent),
    }
    if dialect.kind in COSTS:
        body["cost"] = COSTS[dialect.kind]
    return json.dumps(body)


def _report(
    state: _State, dialect: Dialect, key: str, endpoint: str, data: Mapping[str, Any]
) -> dict[str, Any]:
    if endpoint not in (
        dialect.report_bad_token,
        dialect.report_bad_image,
        dialect.report_good_token,
    ):
        return _error("ERROR_TASK_NOT_SUPPORTED")
    captcha_id = _captcha_id(dialect, data.get("taskId"))
    if captcha_id is None:
        return _error("ERROR_WRONG_CAPTCHA_ID")
    good = endpoint == "reportCorrectRecaptcha" or (
        endpoint == "feedbackTask" and not _invalid(data.get("result"))
    )
    action = "reportgood" if good else "reportbad"
    reply = _reply_data(
        state.res_php({"key": key, "action": action, "id": captcha_id, "json": "1"})
    )
    if reply is None or reply.get("status") != 1:
        return _error(str((reply or {}).get("request", "ERROR_SERVER_ERROR")))
    return {"errorId": 0, "status": "success"}


def _invalid(result: Any) -> bool:
    return isinstance(result, Mapping) and bool(result.get("invalid"))

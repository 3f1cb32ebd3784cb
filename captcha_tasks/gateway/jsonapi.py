"""The JSON face of the gateway: Anti-Captcha's and CapMonster's protocol (CapSolver's
where it differs), every call a ``POST`` of a JSON object with ``clientKey``::

    POST /createTask      {"clientKey": ..., "task": {"type": "TurnstileTaskProxyless", ...}}
                          → {"errorId": 0, "taskId": 17}
    POST /getTaskResult   {"clientKey": ..., "taskId": 17}
                          → {"errorId": 0, "status": "processing"}
                          → {"errorId": 0, "status": "ready", "solution": {"token": ...}}
    POST /getBalance      → {"errorId": 0, "balance": 412.0}
    POST /reportIncorrectImageCaptcha | /reportIncorrectRecaptcha | /reportIncorrectTokenCaptcha
         /reportCorrectRecaptcha | /feedbackTask (CapSolver: "result": {"invalid": true})

Every error is ``{"errorId": 1, "errorCode": "ERROR_...", "errorDescription": "..."}``
(CapMonster and CapSolver number every error 1): an unknown key
``ERROR_KEY_DOES_NOT_EXIST``, an unknown task type ``ERROR_TASK_NOT_SUPPORTED``, a field
the type does not take ``ERROR_INVALID_TASK_DATA``, a body that is not a JSON object
``ERROR_BAD_PARAMETERS`` (HTTP 400), a ``callbackUrl`` the tenant's ``callback_hosts`` do
not allow ``ERROR_BAD_PARAMETERS`` (nothing is submitted), a failed solve its provider
code.  An allowed ``callbackUrl`` is ``POST``ed ``getTaskResult``'s answer (with
``taskId``) when the task is done, as Anti-Captcha does (:mod:`.delivery`).  Task types
and their fields: :mod:`.tasktypes`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from .. import errors
from ..core import callback_urls
from ..core.lanes import Tenant
from ..serving import Response
from . import tasktypes
from .inphp import CALLBACK_REFUSED, validation_code
from .replies import Reply
from .service import JSON_FACE, Answer, BudgetSpent, Callback, Gateway

_JSON = "application/json"


def reply(
    data: Mapping[str, Any], status: int = 200, headers: tuple[tuple[str, str], ...] = ()
) -> Reply:
    body = json.dumps({"errorId": 0, **data}, separators=(",", ":")).encode()
    return Reply(Response(status, body, _JSON, headers))


def error(
    code: str, description: str = "", status: int = 200, headers: tuple[tuple[str, str], ...] = ()
) -> Reply:
    data = {"errorId": 1, "errorCode": code, "errorDescription": description or code}
    body = json.dumps(data, separators=(",", ":")).encode()
    return Reply(Response(status, body, _JSON, headers), code)


def create_task(gateway: Gateway, tenant: Tenant, body: Mapping[str, Any]) -> Reply:
    callback = None
    if body.get("callbackUrl") is not None:
        judged = callback_urls.judge(body["callbackUrl"], tenant.callback_hosts)
        if isinstance(judged, callback_urls.Refused):
            return error(CALLBACK_REFUSED, f"callbackUrl refused: {judged.reason}")
        callback = Callback(judged.url, JSON_FACE)
    lane = body.get("lane")
    try:
        kwargs = tasktypes.solve_kwargs(body.get("task"))
        lane = lane if isinstance(lane, str) else None
        captcha_id = gateway.submit(tenant, kwargs, lane, callback)
    except tasktypes.BadTask as exc:
        return error(exc.code, str(exc))
    except BudgetSpent as exc:
        return error(exc.code, exc.message)
    except errors.ValidationError as exc:
        code = validation_code(exc, None)
        return error(
            "ERROR_INVALID_TASK_DATA" if code == "ERROR_BAD_PARAMETERS" else code, exc.message
        )
    return reply({"taskId": int(captcha_id)})


def _task_id(body: Mapping[str, Any]) -> str | None:
    raw = body.get("taskId")
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        return None
    text = str(raw).strip()
    return text if text.isdigit() and len(text) <= 16 else None


def get_task_result(gateway: Gateway, tenant: Tenant, body: Mapping[str, Any]) -> Reply:
    captcha_id = _task_id(body)
    if captcha_id is None:
        return error("ERROR_NO_SUCH_CAPCHA_ID", "taskId must be a task's number")
    [answer] = gateway.answers(tenant, [captcha_id])
    if answer.state == "unknown":
        return error("ERROR_NO_SUCH_CAPCHA_ID", "no task of yours has this id")
    data = task_result(answer)
    encoded = json.dumps(data, separators=(",", ":")).encode()
    return Reply(Response(200, encoded, _JSON), data.get("errorCode"))


def task_result(answer: Answer) -> dict[str, Any]:
    """``getTaskResult``'s answer for a known task (what a ``callbackUrl`` is sent too)."""
    if answer.state == "pending":
        return {"errorId": 0, "status": "processing"}
    if answer.state == "failed" or answer.outcome is None:
        return {
            "errorId": 1,
            "errorCode": answer.code,
            "errorDescription": answer.message or answer.code,
        }
    method = str(answer.outcome.get("method", ""))
    found = tasktypes.solution(method, answer.token, answer.user_agent)
    return {"errorId": 0, "status": "ready", "solution": found, "cost": "0", "solveCount": 1}


def get_balance(gateway: Gateway, tenant: Tenant, body: Mapping[str, Any]) -> Reply:
    return reply({"balance": gateway.balance(tenant)})


def _report(good: bool) -> Callable[[Gateway, Tenant, Mapping[str, Any]], Reply]:
    def report(gateway: Gateway, tenant: Tenant, body: Mapping[str, Any]) -> Reply:
        captcha_id = _task_id(body)
        if captcha_id is None or not gateway.report(tenant, captcha_id, good):
            return error("ERROR_NO_SUCH_CAPCHA_ID", "no solved task of yours has this id")
        return reply({"status": "success"})

    return report


def feedback_task(gateway: Gateway, tenant: Tenant, body: Mapping[str, Any]) -> Reply:
    result = body.get("result")
    invalid = isinstance(result, dict) and bool(result.get("invalid"))
    return _report(not invalid)(gateway, tenant, body)


Endpoint = Callable[[Gateway, Tenant, Mapping[str, Any]], Reply]
ENDPOINTS: dict[str, Endpoint] = {
    "createTask": create_task,
    "getTaskResult": get_task_result,
    "getBalance": get_balance,
    "reportIncorrectImageCaptcha": _report(False),
    "reportIncorrectRecaptcha": _report(False),
    "reportIncorrectHcaptcha": _report(False),
    "reportIncorrectTokenCaptcha": _report(False),
    "reportCorrectRecaptcha": _report(True),
    "reportCorrectImageCaptcha": _report(True),
    "feedbackTask": feedback_task,
}

"""Routes: start a solve on captcha-tasks' workers and read its status; and the app's own
example task, on the app's own Celery app."""

from __future__ import annotations

from typing import Any

from celery.result import AsyncResult
from flask import Blueprint, current_app, request, url_for
from kombu.exceptions import OperationalError

from captcha_tasks import solve
from captcha_tasks.errors import ValidationError
from captcha_tasks.receiver import MAX_BODY, default_receiver

from .tasks import add_together

bp = Blueprint("captchas", __name__)

Reply = tuple[dict[str, Any], int] | tuple[dict[str, Any], int, dict[str, str]]


@bp.post("/captchas")
def start_solve() -> Reply:
    """Body: JSON ``{"method": ..., "sitekey": ..., "pageurl": ..., **params}``."""
    params = request.get_json(silent=True)
    if not isinstance(params, dict):
        return _invalid("send a JSON object: method, sitekey, pageurl and parameters")
    try:
        # solve validates before anything is queued, on captcha-tasks' own Celery app.
        result = solve.delay(**params)
    except ValidationError as exc:
        return _invalid(str(exc))
    except OperationalError:
        return {"error": "unavailable", "message": "the task queue is unreachable"}, 503
    status_url = url_for(".solve_status", task_id=result.id)
    return {"task_id": result.id, "status_url": status_url}, 202, {"Location": status_url}


# Provider callbacks: set CAPTCHAAI_PINGBACK_URL=https://<this app>/captcha/pingback (and
# CAPTCHAAI_PINGBACK_SECRET here and on the workers).  The receiver judges every request.
@bp.route("/captcha/pingback/<ticket>", methods=["GET", "POST"])
def pingback(ticket: str) -> tuple[str, int]:
    size = request.content_length or 0
    fields, body = request.args.to_dict(), b""
    if size <= MAX_BODY:  # a larger body is refused unread
        body = request.get_data()  # a JSON provider's callback is its body
        fields.update(request.form.to_dict())
    receiver = default_receiver()
    # behind a proxy in CAPTCHAAI_PINGBACK_TRUSTED_PROXIES: the client it names
    address = receiver.client_address(
        request.remote_addr or "", request.headers.get("X-Forwarded-For")
    )
    verdict = receiver.handle_request(request.method, ticket, fields, address, size, body)
    return verdict.reason, verdict.status


@bp.get("/captchas/<task_id>")
def solve_status(task_id: str) -> Reply:
    """``state`` is PENDING until the outcome is stored (unknown ids are PENDING too)."""
    return describe(solve.AsyncResult(task_id)), 200


def describe(result: AsyncResult) -> dict[str, Any]:
    """A JSON view of a solve's state: the outcome on success, the error code on failure."""
    body: dict[str, Any] = {"task_id": result.id, "state": result.state}
    if result.successful():
        body["result"] = result.result
    elif result.failed():
        exc = result.result
        body["error"] = getattr(exc, "code", type(exc).__name__)
        body["message"] = str(exc)
    return body


def _invalid(message: str) -> Reply:
    return {"error": "validation", "message": message}, 400


@bp.post("/add")
def start_add() -> Reply:
    """The app's own task (Flask's guide), queued on this app's Celery app."""
    a = request.form.get("a", type=int)
    b = request.form.get("b", type=int)
    if a is None or b is None:
        return _invalid("form fields a and b must be integers")
    result = add_together.delay(a, b)
    return {"task_id": result.id}, 202


@bp.get("/add/<task_id>")
def add_result(task_id: str) -> Reply:
    """Read with this app's Celery app: each app reads its own results."""
    result = current_app.extensions["celery"].AsyncResult(task_id)
    body: dict[str, Any] = {"task_id": task_id, "state": result.state}
    if result.successful():
        body["result"] = result.result
    return body, 200

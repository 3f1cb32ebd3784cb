"""Views: start a solve on captcha-tasks' workers and read its status; and the project's
own example task, on the project's own Celery app."""

from __future__ import annotations

import json
from typing import Any

from celery.result import AsyncResult
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from kombu.exceptions import OperationalError
from proj.celery import app as project_celery

from captcha_tasks import solve
from captcha_tasks.errors import ValidationError
from captcha_tasks.receiver import MAX_BODY, default_receiver

from .tasks import add


# An API for server-side callers: authenticate them your own way; CSRF is for browsers.
@csrf_exempt
@require_POST
def start_solve(request: HttpRequest) -> JsonResponse:
    """Body: JSON ``{"method": ..., "sitekey": ..., "pageurl": ..., **params}``."""
    try:
        params = json.loads(request.body)
    except ValueError:
        params = None
    if not isinstance(params, dict):
        return _invalid("send a JSON object: method, sitekey, pageurl and parameters")
    try:
        # solve validates before anything is queued, on captcha-tasks' own Celery app.
        result = solve.delay(**params)
    except ValidationError as exc:
        return _invalid(str(exc))
    except OperationalError:
        body = {"error": "unavailable", "message": "the task queue is unreachable"}
        return JsonResponse(body, status=503)
    status_url = reverse("solve-status", args=[result.id])
    response = JsonResponse({"task_id": result.id, "status_url": status_url}, status=202)
    response["Location"] = status_url
    return response


# Provider callbacks: set CAPTCHAAI_PINGBACK_URL=https://<this site>/captcha/pingback (and
# CAPTCHAAI_PINGBACK_SECRET here and on the workers).  The receiver judges every request.
@csrf_exempt
def pingback(request: HttpRequest, ticket: str) -> HttpResponse:
    size = int(request.META.get("CONTENT_LENGTH") or 0)
    fields, body = request.GET.dict(), b""
    if request.method == "POST" and size <= MAX_BODY:  # a larger body is refused unread
        body = request.body  # a JSON provider's callback is its body (read before POST)
        fields.update(request.POST.dict())
    receiver = default_receiver()
    # behind a proxy in CAPTCHAAI_PINGBACK_TRUSTED_PROXIES: the client it names
    address = receiver.client_address(
        request.META.get("REMOTE_ADDR", ""), request.META.get("HTTP_X_FORWARDED_FOR")
    )
    verdict = receiver.handle_request(request.method or "", ticket, fields, address, size, body)
    return HttpResponse(verdict.reason, status=verdict.status, content_type="text/plain")


@require_GET
def solve_status(request: HttpRequest, task_id: str) -> JsonResponse:
    """``state`` is PENDING until the outcome is stored (unknown ids are PENDING too)."""
    return JsonResponse(describe(solve.AsyncResult(task_id)))


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


def _invalid(message: str) -> JsonResponse:
    return JsonResponse({"error": "validation", "message": message}, status=400)


@csrf_exempt
@require_POST
def start_add(request: HttpRequest) -> JsonResponse:
    """The project's own task, queued on the project's Celery app."""
    try:
        x, y = int(request.POST["x"]), int(request.POST["y"])
    except (KeyError, ValueError):
        return _invalid("form fields x and y must be integers")
    return JsonResponse({"task_id": add.delay(x, y).id}, status=202)


@require_GET
def add_result(request: HttpRequest, task_id: str) -> JsonResponse:
    """Read with the project's Celery app: each app reads its own results."""
    result = project_celery.AsyncResult(task_id)
    body: dict[str, Any] = {"task_id": task_id, "state": result.state}
    if result.successful():
        body["result"] = result.result
    return JsonResponse(body)

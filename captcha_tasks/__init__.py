"""captcha-tasks: CaptchaAI solving as Celery tasks shared by many workers.

from captcha_tasks import solve
result = solve.delay(method="turnstile", sitekey="0x4AAA...", pageurl="https://example.com")
result.get(timeout=120)["token"]
"""

from __future__ import annotations

from . import errors
from .client import NOT_READY, CaptchaAIClient
from .errors import CaptchaTasksError, ValidationError
from .methods import METHODS, SolveRequest, build_request
from .outcome import Failed, Solved, outcome_from_dict
from .settings import Settings, get_settings
from .state import store
from .stream import stream
from .worker.app import app
from .worker.tasks import create_pool, poll, report, solve, submit, take_token

__all__ = [
    "METHODS",
    "NOT_READY",
    "CaptchaAIClient",
    "CaptchaTasksError",
    "Failed",
    "Settings",
    "SolveRequest",
    "Solved",
    "ValidationError",
    "app",
    "build_request",
    "create_pool",
    "errors",
    "get_settings",
    "outcome_from_dict",
    "poll",
    "report",
    "solve",
    "store",
    "stream",
    "submit",
    "take_token",
]

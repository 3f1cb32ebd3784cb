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
    "stream",
    "submit",
    "take_token",
]


def __getattr__(name: str) -> object:
    # Deprecated: ``captcha_tasks.store`` (handles fetched from globals) goes away in the
    # next release; the state is one value now (captcha_tasks.state.State).
    if name == "store":
        import warnings

        from .state import store

        warnings.warn(
            "captcha_tasks.store is deprecated: build captcha_tasks.state.State from the "
            "settings, or use captcha_tasks.toolkit",
            DeprecationWarning,
            stacklevel=2,
        )
        return store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""captcha-tasks: CaptchaAI solving as Celery tasks shared by many workers.

from captcha_tasks import solve
result = solve.delay(method="turnstile", sitekey="0x4AAA...", pageurl="https://example.com")
result.get(timeout=120)["token"]

The names below load on first use, all together (Celery and the tasks with them), so that
``import captcha_tasks.cli`` or ``captcha_tasks.settings`` does not pay for Celery: the
``captcha-tasks`` command imports only what the sub-command it runs needs.
"""

from __future__ import annotations

import importlib
import typing

if typing.TYPE_CHECKING:
    from . import errors
    from .batch import stream
    from .core.answers import NOT_READY
    from .core.outcome import Failed, Solved, outcome_from_dict
    from .errors import CaptchaTasksError, ValidationError
    from .methods import METHODS, SolveRequest, build_request
    from .providers.inphp import CaptchaAIClient
    from .settings import Settings, get_settings
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

#: Where each public name lives: (module, attribute; None for the module itself).
_SOURCES: dict[str, tuple[str, str | None]] = {
    "errors": (".errors", None),
    "NOT_READY": (".core.answers", "NOT_READY"),
    "CaptchaAIClient": (".providers.inphp", "CaptchaAIClient"),
    "CaptchaTasksError": (".errors", "CaptchaTasksError"),
    "ValidationError": (".errors", "ValidationError"),
    "METHODS": (".methods", "METHODS"),
    "SolveRequest": (".methods", "SolveRequest"),
    "build_request": (".methods", "build_request"),
    "Failed": (".core.outcome", "Failed"),
    "Solved": (".core.outcome", "Solved"),
    "outcome_from_dict": (".core.outcome", "outcome_from_dict"),
    "Settings": (".settings", "Settings"),
    "get_settings": (".settings", "get_settings"),
    "stream": (".batch", "stream"),
    "app": (".worker.app", "app"),
    "create_pool": (".worker.tasks", "create_pool"),
    "poll": (".worker.tasks", "poll"),
    "report": (".worker.tasks", "report"),
    "solve": (".worker.tasks", "solve"),
    "submit": (".worker.tasks", "submit"),
    "take_token": (".worker.tasks", "take_token"),
}
_loading = False


def __getattr__(name: str) -> typing.Any:
    # Any public name loads them all: `celery -A captcha_tasks` finds `app` with its tasks
    # registered, exactly as when this module imported them eagerly.
    if name == "__version__":
        from importlib.metadata import version

        return version("captcha-tasks")
    source = _SOURCES.get(name)
    if source is not None and source[1] is None:
        # A submodule (errors): alone.  Inside the package `from . import errors` lands
        # here when it runs first; loading everything would import the very module that
        # is importing it (`import captcha_tasks.core.batching` in a fresh process).
        return importlib.import_module(source[0], __name__)
    if name not in _SOURCES or _loading:
        # While loading, a submodule's `from .. import errors` must see "no such attribute
        # yet" and import the submodule itself, not start a second load.
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _load()
    return globals()[name]


def _load() -> None:
    global _loading
    _loading = True
    try:
        found = {}
        for public, (module, attribute) in _SOURCES.items():
            loaded = importlib.import_module(module, __name__)
            found[public] = loaded if attribute is None else getattr(loaded, attribute)
        globals().update(found)
    finally:
        _loading = False


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

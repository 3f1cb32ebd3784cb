"""The public API as the tests pin it: a removal or rename here is a breaking change.

tests/core/test_public_api.py checks the package against it, and tests/docs/test_site.py
checks that the documentation's Python API page lists exactly these import paths."""

from __future__ import annotations

#: ``from captcha_tasks import <name>``.
EXPORTED = {
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
}

#: Import paths from deeper modules that the documentation tells users to use.
DOCUMENTED = [
    "captcha_tasks.stream.stream",
    "captcha_tasks.aio.solve",
    "captcha_tasks.aio.stream",
    "captcha_tasks.errors.FatalError",
    "captcha_tasks.toolkit.sessions.CookieStore",
    "captcha_tasks.toolkit.sessions.SessionLock",
    "captcha_tasks.toolkit.sessions.reauthenticate",
    "captcha_tasks.toolkit.proxies.ProxyPool",
    "captcha_tasks.state.State",
    "captcha_tasks.kafka.client.TaskProducer",
    "captcha_tasks.receiver.default_receiver",
    "captcha_tasks.schemas.load",
]

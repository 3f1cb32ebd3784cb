"""Pins the public API: a removal or rename here is a breaking change."""

from __future__ import annotations

import captcha_tasks


def test_exported_members() -> None:
    assert set(captcha_tasks.__all__) == {
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
    }
    for name in captcha_tasks.__all__:
        assert getattr(captcha_tasks, name) is not None


def test_task_names() -> None:
    names = {t for t in captcha_tasks.app.tasks if t.startswith("captcha_tasks.")}
    assert names == {
        "captcha_tasks.solve",
        "captcha_tasks.submit",
        "captcha_tasks.poll",
        "captcha_tasks.prewarm",
        "captcha_tasks.report",
    }

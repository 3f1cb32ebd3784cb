"""Every Celery setting of captcha-tasks is one the installed Celery knows: an older Celery
ignores a setting it lacks without a word (5.5 and ``worker_eta_task_limit``), so this
holds the ``celery`` lower bound in pyproject.toml (scripts/test-lowest runs it there)."""

from __future__ import annotations

import pytest
from celery.app.defaults import NAMESPACES, flatten

from captcha_tasks.settings import Settings
from captcha_tasks.worker.config import celery_config

pytestmark = pytest.mark.unit

#: Read by celery-redbeat (the ``redbeat`` extra), not by Celery.
REDBEAT = "redbeat_"


def our_settings() -> set[str]:
    return {name for name in celery_config(Settings.from_env({})) if not name.startswith(REDBEAT)}


def test_celery_knows_every_setting_we_give_it() -> None:
    known = {name for name, _ in flatten(NAMESPACES)}
    ours = our_settings()
    assert {"worker_eta_task_limit", "task_acks_late", "broker_url"} <= ours
    assert sorted(ours - known) == [], "settings this Celery ignores"


def test_running_tasks_are_not_cancelled_when_the_broker_connection_drops() -> None:
    """Set explicitly (False: a threads pool cannot cancel a task, and each step is
    idempotent); Celery's notice about its coming default is muted by its own text."""
    import re

    from celery.worker.consumer.consumer import CANCEL_TASKS_BY_DEFAULT

    from captcha_tasks.worker.app import CANCEL_NOTICE

    config = celery_config(Settings.from_env({}))
    assert config["worker_cancel_long_running_tasks_on_connection_loss"] is False
    assert re.match(CANCEL_NOTICE, CANCEL_TASKS_BY_DEFAULT)
    assert not re.match(CANCEL_NOTICE, "\nsome other notice of Celery 5.1")

"""The package's own Celery app, configured from ``celeryconfig``."""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import worker_process_init

from . import settings as _settings
from . import store

app = Celery("captcha_tasks")
app.config_from_object("celeryconfig")


@worker_process_init.connect
def _fresh_handles(**_: Any) -> None:
    # A forked child must not share its parent's sockets.
    store.reset()
    _settings.reset_settings()

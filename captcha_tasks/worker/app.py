"""The package's own Celery app.

It is configured from :mod:`captcha_tasks.worker.config` by that module's full name (a
host project's own ``celeryconfig`` cannot shadow it) and is never the "current" app: a
Django or Flask project's own Celery app stays theirs, and their shared tasks never pick
up our configuration (see ``examples/``).
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    beat_init,
    worker_init,
    worker_process_init,
)

from .. import redact
from .. import settings as _settings
from ..state import store
from . import flower_auth, startup
from .housekeeping import Housekeeping, register_configured_pools

CONFIG_MODULE = "captcha_tasks.worker.config"

app = Celery("captcha_tasks", set_as_current=False)


def _refuse_bad_settings(**_: Any) -> None:
    # The app is first configured while the `celery` command parses the sub-command's
    # options: the earliest moment to stop `celery -A captcha_tasks worker|beat|...`.
    startup.check(startup.celery_command(app))


app.on_configure.connect(_refuse_bad_settings, weak=False)
app.config_from_object(CONFIG_MODULE)
app.steps["worker"].add(Housekeeping)
flower_auth.install(app)


def _ours(sender: Any) -> bool:
    return getattr(sender, "app", app) is app


@worker_process_init.connect
def _fresh_handles(sender: Any = None, **_: Any) -> None:
    # A forked child must not share its parent's sockets.
    store.reset()
    _settings.reset_settings()


@worker_init.connect
@beat_init.connect
def _register_pools(sender: Any = None, **_: Any) -> None:
    # Pools declared in CAPTCHAAI_POOLS become visible to every process through Redis;
    # a framework's own worker in the same process tree has nothing to register.
    if _ours(sender):
        register_configured_pools()


@after_setup_logger.connect
@after_setup_task_logger.connect
def _redact_logs(logger: Any = None, **_: Any) -> None:
    # No API key, proxy password, cookie value or whole token in any log line.
    redact.install(logger)
    redact.install()

"""A Flask app that solves captchas through captcha-tasks.

Two Celery apps share one Redis:

* captcha-tasks' own app (``captcha_tasks.app``) with its ``celeryconfig`` (JSON only, late
  acks, the ``captcha.*`` queues).  ``solve.delay(...)`` always goes through it, from any
  process: its tasks are never registered on this app.
* this app's Celery app, made by ``celery_init_app`` as in Flask's Celery guide, for the
  app's own tasks on its own queue (``flask``).

Workers, side by side on the same Redis::

    celery -A captcha_tasks worker -P threads -c 32 -l INFO     # captcha.* queues
    celery -A make_celery worker -Q flask -l INFO                # this app's tasks
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from celery import Celery, Task
from flask import Flask

#: This app's own queue: never one of captcha-tasks' (captcha.solve, captcha.submit, ...).
QUEUE = "flask"


def celery_init_app(app: Flask) -> Celery:
    """Flask's Celery guide: a Celery app whose tasks run inside the Flask app context."""

    class FlaskTask(Task):
        def __call__(self, *args: object, **kwargs: object) -> object:
            with app.app_context():
                return self.run(*args, **kwargs)

    celery_app = Celery(app.name, task_cls=FlaskTask)
    celery_app.config_from_object(app.config["CELERY"])
    celery_app.set_default()
    app.extensions["celery"] = celery_app
    return celery_app


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    """The app factory: configuration, this app's Celery app, the routes."""
    app = Flask(__name__)
    # One Redis for both apps: captcha-tasks reads REDIS_URL too.
    redis_url = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
    app.config.from_mapping(
        CELERY={
            "broker_url": redis_url,
            "result_backend": redis_url,
            "task_ignore_result": True,
            "task_default_queue": QUEUE,
            "task_serializer": "json",
            "result_serializer": "json",
            "accept_content": ["json"],
            "broker_connection_retry_on_startup": True,
        },
    )
    if test_config:
        app.config.from_mapping(test_config)
    app.config.from_prefixed_env()  # e.g. FLASK_CELERY__broker_url=redis://...
    celery_init_app(app)

    from . import views

    app.register_blueprint(views.bp)
    return app

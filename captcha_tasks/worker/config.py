"""Every Celery setting of captcha-tasks, in one place: :func:`celery_config`.

The package's app (:mod:`captcha_tasks.worker.app`) is configured with
``celery_config(settings)`` of its own settings when Celery first needs its
configuration, so a second app in one process (a test, a user's app) gets its own broker
and queues.  Nothing here reads the environment.
"""

from __future__ import annotations

from typing import Any

from kombu import Queue  # type: ignore[attr-defined]

from ..settings import Settings
from ..state.connections import celery_options
from ..state.keys import Keys
from .broker import backend_url, transport
from .names import PREWARM

#: The settings that do not depend on the deployment.
STATIC: dict[str, Any] = {
    # JSON only: pickle is refused everywhere.
    "task_serializer": "json",
    "result_serializer": "json",
    "accept_content": ["json"],
    "result_accept_content": ["json"],
    "event_serializer": "json",
    # Every task is a few short HTTP calls: acknowledge after the work, and give a killed
    # worker's messages back quickly.  The visibility timeout must exceed every countdown
    # (tasks reschedule themselves at most half of it ahead).
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
    # When the broker connection drops, a task already running finishes its step (every
    # step is idempotent; its ack, lost with the connection, makes the message come back
    # after the visibility timeout and its rerun find the work done) instead of being
    # cancelled: the threads pool cannot cancel one (Celery 5.6 raises there, 5.7 warns per
    # task), and a cancel would store the solve's record as RETRY.  Celery warns about the
    # coming default whenever this is off, set or not: the worker mutes that one notice
    # (app._quiet_notice).
    "worker_cancel_long_running_tasks_on_connection_loss": False,
    "broker_connection_retry_on_startup": True,
    "result_expires": 3600,
    # Extended results would store raw task arguments (a caller's proxy password) in Redis.
    "result_extended": False,
    # Countdown messages (poll rounds, submits waiting for a budget) are held in memory
    # until due; there are few of them: captchas wait for their polls in Redis, not in
    # messages.
    "worker_eta_task_limit": 2000,
    "worker_prefetch_multiplier": 4,
    # Poll rounds are countdown (ETA) messages a few hundred ms apart; the timer thread
    # must not oversleep them (Celery's default lets it sleep up to a second).
    "worker_timer_precision": 0.01,
    "task_track_started": False,
    "task_time_limit": 120,
    "task_soft_time_limit": 100,
    # A worker started with -A captcha_tasks.worker.app registers the tasks too, and the
    # gateway's delivery to client callbacks (sent by the completion of a gateway solve).
    "imports": ("captcha_tasks.worker.tasks", "captcha_tasks.gateway.delivery"),
    # task_routes: the app's own router (captcha_tasks.worker.app.App.route), by the
    # settings of the process that sends.
    "worker_hijack_root_logger": False,
    # Task events cost a fan-out publish each (three per task).  They are off until a
    # monitor asks for them: Flower turns them on in every worker every few seconds while
    # it runs, and `celery worker -E` keeps them on.
    "worker_send_task_events": False,
    "task_send_sent_event": False,
    # Optional standby beat with celery-redbeat (`pip install captcha-tasks[redbeat]`,
    # then `celery -A captcha_tasks beat -S redbeat.RedBeatScheduler`): only the holder of
    # its Redis lock ticks; a standby takes over at most redbeat_lock_timeout after a crash.
    "redbeat_lock_timeout": 30,
    "beat_max_loop_interval": 5,
}


def celery_config(settings: Settings) -> dict[str, Any]:
    """Every Celery setting of an app working with ``settings``."""
    return {**STATIC, **deployment_config(settings)}


def deployment_config(settings: Settings) -> dict[str, Any]:
    """The Celery settings that ``settings`` decide: where the broker and the results are,
    the queues, beat's schedule and RedBeat's keys."""
    where = celery_options(settings)
    broker_url = where["broker_url"]
    return {
        "broker_url": broker_url,
        # kombu's Redis (or Sentinel) transport, surviving a dropped connection (see
        # .broker); unix sockets keep kombu's own.
        "broker_transport": transport(broker_url),
        "result_backend": backend_url(where["result_backend"]),
        "broker_use_ssl": where["broker_use_ssl"],
        "redis_backend_use_ssl": where["redis_backend_use_ssl"],
        "broker_transport_options": where["broker_transport_options"],
        "result_backend_transport_options": where["result_backend_transport_options"],
        "broker_channel_error_retry": where["broker_channel_error_retry"],
        "task_default_queue": settings.celery.queue("solve"),
        "task_queues": tuple(Queue(name) for name in settings.celery.queues),  # type: ignore[no-untyped-call]
        # Beat: hand freed slots to parked submits and keep token pools filled before they
        # expire.
        "beat_schedule": {
            "captcha-tasks-prewarm": {
                "task": PREWARM,
                "schedule": settings.pools.prewarm_every,
                # Nobody reads a tick's result: storing it would keep a record for an hour.
                "options": {"expires": settings.pools.prewarm_every, "ignore_result": True},
            },
        },
        "redbeat_redis_url": where["redbeat_redis_url"],
        "redbeat_redis_options": where["redbeat_redis_options"],
        "redbeat_key_prefix": Keys(settings.redis.key_prefix).redbeat_prefix(),
    }

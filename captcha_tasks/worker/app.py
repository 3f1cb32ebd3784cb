"""The package's own Celery app.

It is configured with :func:`~captcha_tasks.worker.config.celery_config` of its settings
when Celery first needs its configuration (a host project's own ``celeryconfig`` cannot
shadow it), and is never the "current" app: a Django or Flask project's own Celery app
stays theirs, and their shared tasks never pick up our configuration (see
``examples/``).

The app knows its process's :class:`~.runtime.Runtime` (:meth:`App.runtime`): the settings,
Redis state, API client and runner every task of this process works with.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from typing import Any

from celery import Celery
from celery.exceptions import CPendingDeprecationWarning
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    beat_init,
    celeryd_after_setup,
    worker_init,
    worker_process_init,
)

from ..core.lanes import INTERACTIVE, LANES
from ..errors import StoreUnavailable
from ..settings import Settings, get_settings, reset_settings
from ..state import State
from . import flower_auth, names, redact, startup
from .config import celery_config, deployment_config
from .housekeeping import Housekeeping, KeepTicking
from .runtime import Runtime


def _configure(sender: Any = None, **_: Any) -> None:
    # The app is first configured while the `celery` command parses the sub-command's
    # options: the earliest moment to stop `celery -A captcha_tasks worker|beat|...`.
    startup.check(startup.celery_command(sender))
    sender.configure_from_settings()


class App(Celery):
    """captcha-tasks' Celery app: it builds its process's runtime once, when first needed."""

    #: Its ``AsyncResult.revoke()`` is remembered in Redis too (:meth:`remember_revoked`).
    control_cls = "captcha_tasks.worker.celery_compat.messages:Control"

    def __init__(self, *args: Any, settings: Settings | None = None, **kwargs: Any) -> None:
        """A Celery app of captcha-tasks, working with ``settings`` (None: the
        environment's, read on first use), its own broker, result backend and queues
        among them.  :func:`captcha_tasks.worker.tasks.new_app` makes one with the
        package's tasks."""
        super().__init__(*args, **kwargs)
        self._runtime: Runtime | None = None
        #: The settings :meth:`use` gave (None: the environment's).
        self._settings: Settings | None = None
        self._runtime_lock = threading.Lock()
        self.on_configure.connect(_configure, weak=False)
        self.conf.task_routes = (self.route,)
        self.steps["worker"].add(Housekeeping)
        self.steps["consumer"].add(KeepTicking)
        if settings is not None:
            self.use(settings)

    def runtime(self) -> Runtime:
        """This process's runtime (built from :meth:`settings` on first use)."""
        runtime = self._runtime
        if runtime is None:
            with self._runtime_lock:
                if self._runtime is None:
                    self._runtime = Runtime(self, self.settings())
                runtime = self._runtime
        return runtime

    def use(self, settings: Settings, state: State | None = None) -> Runtime:
        """Work with ``settings`` (and ``state``) from now on in this process: for entry
        points and tests that configure themselves instead of reading the environment.

        Before the app's first connection this sets everything, the broker and the
        result backend among it; after, the queues, beat's schedule and the keys (a
        connection already made stays where it is)."""
        with self._runtime_lock:
            # First: building the runtime reads Celery's configuration, built from these.
            self._settings = settings
            self._runtime = Runtime(self, settings, state)
            runtime = self._runtime
        if self.configured:
            self.conf.update(deployment_config(settings))
        return runtime

    def remember_revoked(self, task_ids: list[str]) -> None:
        """Remember revoked solves in Redis, so that no worker submits them, whether or not
        it heard the broadcast (a parked solve's message ran long ago; a worker started
        after the revoke never hears it): called by the app's ``control.revoke``."""
        self.runtime().state.records.revoke(task_ids)

    def settings(self) -> Settings:
        """This app's settings: those :meth:`use` gave, else the environment's."""
        return self._settings if self._settings is not None else get_settings()

    def configure_from_settings(self) -> None:
        """Take Celery's configuration from this app's settings: run when Celery first
        reads it (``on_configure``)."""
        self.config_from_object(celery_config(self.settings()))

    def forget_runtime(self) -> None:
        """Build the runtime again on next use (a forked child must not share its
        parent's sockets)."""
        with self._runtime_lock:
            self._runtime = None

    def _after_fork(self) -> None:
        # The parent's lock may have been held by one of its threads: a new one, unheld.
        self._runtime_lock = threading.Lock()
        self._runtime = None

    def route(
        self, name: str, args: Any = None, kwargs: Any = None, *_: Any, **__: Any
    ) -> dict[str, str] | None:
        """Celery router: each task to its queue, named by this process's settings; a
        solve to the queue of its lane."""
        kind = names.QUEUE_OF_TASK.get(name)
        if kind is None:
            return None
        settings = self.runtime().settings
        if name == names.SOLVE:
            lane = (kwargs or {}).get("lane") if isinstance(kwargs, dict) else None
            return {"queue": settings.celery.solve_queue(lane if lane in LANES else INTERACTIVE)}
        return {"queue": settings.celery.queue(kind)}


app = App("captcha_tasks", set_as_current=False)
# Every forked child (a prefork worker, os.fork in your code) builds its own runtime.
os.register_at_fork(after_in_child=app._after_fork)


flower_auth.install(app)


def _ours(sender: Any) -> bool:
    return isinstance(getattr(sender, "app", app), App)


def _app_of(sender: Any) -> App:
    found = getattr(sender, "app", None)
    return found if isinstance(found, App) else app


@worker_process_init.connect
def _fresh_settings(sender: Any = None, **_: Any) -> None:
    # A prefork child reads the environment afresh (its runtime is rebuilt at the fork).
    reset_settings()


@worker_init.connect
@beat_init.connect
def _register_pools(sender: Any = None, **_: Any) -> None:
    # Pools declared in CAPTCHAAI_POOLS become visible to every process through Redis;
    # a framework's own worker in the same process tree has nothing to register.
    if _ours(sender):
        _app_of(sender).runtime().register_configured()


#: The start of Celery's notice, at every lost broker connection, that
#: ``worker_cancel_long_running_tasks_on_connection_loss`` will default to True in 6.0.
CANCEL_NOTICE = r"\s*In Celery 5\.1 we introduced an optional breaking change"


@celeryd_after_setup.connect
def _quiet_notice(instance: Any = None, **_: Any) -> None:
    # The setting is set, to False (see .config); Celery warns whenever it is off.  After
    # the worker's logging set-up, which shows every pending deprecation ('always').
    if _ours(instance):
        warnings.filterwarnings("ignore", CANCEL_NOTICE, CPendingDeprecationWarning)


#: Seconds between two reports of beat's reconnects (beat has no housekeeping tick).
BEAT_REPORT_S = 5.0


@beat_init.connect
def _report_master_changes(sender: Any = None, **_: Any) -> None:
    # Beat's own connections count their reconnects in this process; a thread adds them
    # to the deployment's count (captcha_tasks_redis_reconnects_total{process="beat"}).
    if _ours(sender):
        master_changes = _app_of(sender).runtime().state.master_changes
        threading.Thread(
            target=_report_every,
            args=(master_changes,),
            name="captcha-tasks-master-changes",
            daemon=True,
        ).start()


def _report_every(master_changes: Any) -> None:
    cadence = threading.Event()  # never set: a timer that nothing interrupts
    while not cadence.wait(BEAT_REPORT_S):
        with contextlib.suppress(StoreUnavailable):  # counted with the next report
            master_changes.report("beat")


@after_setup_logger.connect
@after_setup_task_logger.connect
def _redact_logs(logger: Any = None, **_: Any) -> None:
    # No API key, proxy password, cookie value or whole token in any log line.
    redact.install(logger, app.settings)
    redact.install(None, app.settings)

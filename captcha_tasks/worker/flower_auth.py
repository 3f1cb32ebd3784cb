"""``celery -A captcha_tasks flower`` refuses to start without authentication.

Flower shows every task's arguments and results and, through its API, can revoke tasks and
shut workers down, so an open Flower is an open door.  Credentials come from Flower's own
settings: ``FLOWER_BASIC_AUTH=user:password[,user2:password2]`` (or ``--basic-auth`` /
``flowerconfig.py``), or OAuth (``--auth``).  An operator whose reverse proxy already
authenticates every request opts out with ``CAPTCHAAI_FLOWER_NO_AUTH=1``.

The hook: Flower parses its options (``FLOWER_*`` variables, ``flowerconfig.py``, the
command line) and then builds its web application, whose constructor calls
``app.loader.import_default_modules()``; that sends Celery's ``import_modules`` signal.
Our receiver runs there, only under the ``flower`` sub-command, with every option final,
and before Flower binds its port.  Flower's ``/metrics`` and ``/healthcheck`` stay open
whatever the settings (Flower does not protect them).

The same hook makes Flower stop when told to while Redis is down.  Flower's own SIGTERM
handler exits the interpreter, which then waits for the threads of Flower's executor, and
one of them retries the unreachable broker for minutes: SIGTERM and Ctrl-C seemed ignored
until SIGKILL.  Ours does what Flower's does and, should the exit still hang after
:data:`EXIT_GRACE_S`, ends the process.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

import click
from celery import Celery
from celery.signals import import_modules

from ..settings import Settings
from . import startup
from .startup import EXIT_CONFIG

log = logging.getLogger(__name__)

NO_AUTH_MESSAGE = (
    "captcha-tasks: Flower will not start without authentication: it shows task arguments "
    "and results and can control workers.\n"
    "  Set FLOWER_BASIC_AUTH=user:password[,user2:password2] (or --basic-auth, "
    "flowerconfig.py, or OAuth with --auth),\n"
    "  or set CAPTCHAAI_FLOWER_NO_AUTH=1 if a reverse proxy in front of Flower "
    "authenticates every request."
)


def auth_problem(basic_auth: Sequence[str] | None, oauth: str | None) -> str | None:
    """Why Flower's authentication options are not usable (None when they are).

    ``basic_auth`` is Flower's parsed list of ``user:password`` entries; ``oauth`` its
    ``--auth`` pattern of allowed OAuth accounts.
    """
    if oauth:
        return None
    entries = [entry for entry in (basic_auth or []) if entry.strip()]
    if not entries:
        return NO_AUTH_MESSAGE
    for index, entry in enumerate(entries, start=1):
        user, sep, password = entry.partition(":")
        if not (sep and user.strip() and password):
            # The entry itself is not echoed: it may be a password typed in the wrong place.
            return (
                f"captcha-tasks: Flower will not start: basic-auth entry #{index} is not "
                "user:password (FLOWER_BASIC_AUTH=user:password[,user2:password2])."
            )
    return None


def install(app: Celery) -> None:
    """Make ``celery -A <app> flower`` refuse to start without authentication."""
    import_modules.connect(
        _check_flower_start, sender=app, weak=False, dispatch_uid="captcha_tasks.worker.flower_auth"
    )


#: Seconds Flower may take to exit after SIGTERM or Ctrl-C before the process is ended.
EXIT_GRACE_S = 5.0


def _stop(signum: int, _frame: FrameType | None) -> None:
    """Flower's stop (its SIGTERM handler exits the interpreter), with a deadline: a thread
    stuck retrying an unreachable broker must not keep the process alive."""
    log.info("%s: Flower stops", signal.Signals(signum).name)
    timer = threading.Timer(EXIT_GRACE_S, os._exit, (0,))
    timer.daemon = True
    timer.start()
    sys.exit(0)


def _exit_promptly() -> None:
    import flower.command

    # Flower installs ``flower.command.sigterm_handler`` after building its app (after this
    # hook): the name is looked up then, so ours is the one installed.
    flower.command.sigterm_handler = _stop
    signal.signal(signal.SIGINT, _stop)


def _check_flower_start(sender: Any = None, **_: Any) -> None:
    if not _running_flower():
        return
    _exit_promptly()
    startup.check("flower")  # a bad setting: one line, before the credentials are read
    from flower.options import options  # Tornado's global options, as Flower parsed them

    problem = auth_problem(options.basic_auth, options.auth)
    if problem is None:
        return
    if _settings(sender).celery.flower_no_auth:
        log.warning("Flower runs WITHOUT authentication (CAPTCHAAI_FLOWER_NO_AUTH is set)")
        return
    click.echo(problem, err=True)
    # SystemExit passes through Celery's signal dispatch, which only catches Exception.
    sys.exit(EXIT_CONFIG)


def _settings(app: Any) -> Settings:
    # Flower's start-up: its app's settings (captcha-tasks' App), else the environment's.
    own = getattr(app, "settings", None)
    return own() if callable(own) else Settings.from_env()


def _running_flower() -> bool:
    # Workers and beat import default modules too; only the flower sub-command is checked.
    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.command.name == "flower"

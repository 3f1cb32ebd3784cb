"""``celery -A captcha_tasks worker|beat|flower|...`` refuses to start with a bad setting.

A wrong value, or a worker without ``CAPTCHAAI_API_KEY`` or with a key the API rejects (one
``getbalance`` at start-up), stops the process with one line naming the variable (exit 78,
sysexits' EX_CONFIG) before anything starts, the way the ``captcha-tasks`` command reports
it.  Outside the ``celery`` command (an app calling
``solve``, a framework's own worker) nothing happens here: the caller gets the
:class:`~captcha_tasks.errors.ConfigurationError` itself.
"""

from __future__ import annotations

import sys

import click
from celery import Celery

from ..client import CaptchaAIClient, Timeout
from ..errors import AuthError, CaptchaTasksError, ConfigurationError
from ..settings import Settings, get_settings

#: sysexits.h EX_CONFIG: the process cannot run with this configuration.
EXIT_CONFIG = 78


def celery_command(app: Celery) -> str | None:
    """The sub-command of ``celery -A <app> ...`` running in this thread, if any."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return None
    root = ctx.find_root()
    if getattr(root.obj, "app", None) is not app:
        return None
    return root.invoked_subcommand or ctx.info_name


def problem(command: str) -> ConfigurationError | None:
    """What stops ``celery <command>`` from starting with this environment, if anything."""
    try:
        settings = get_settings()
    except ConfigurationError as exc:
        return exc
    return _missing(command, settings)


def _missing(command: str, settings: Settings) -> ConfigurationError | None:
    if command != "worker":
        return None
    if not settings.api_key:
        return ConfigurationError(
            "CAPTCHAAI_API_KEY is not set: a worker needs the account key to call the API"
        )
    return _key_refused(settings)


#: The start-up balance check waits at most this long: an API that is slow or down now must
#: not keep a worker from starting (its tasks retry), only a key it refuses.
_CHECK_TIMEOUT = Timeout(connect=3.0, read=5.0)


def _key_refused(settings: Settings) -> ConfigurationError | None:
    timeout = Timeout(
        connect=min(settings.connect_timeout, _CHECK_TIMEOUT.connect),
        read=min(settings.read_timeout, _CHECK_TIMEOUT.read),
    )
    client = CaptchaAIClient(settings.base_url, settings.api_key, timeout=timeout, pool_size=1)
    try:
        client.balance()
    except AuthError as exc:
        return ConfigurationError(f"{exc.code}: {exc.message}")
    except CaptchaTasksError:
        return None  # unreachable or failing now: the tasks back off and retry
    return None


def check(command: str | None) -> None:
    """Exit with one line when ``celery <command>`` cannot run (None: not the CLI)."""
    if command is None:
        return
    exc = problem(command)
    if exc is None:
        return
    click.echo(f"celery {command}: {type(exc).__name__}: {exc.message}", err=True)
    # SystemExit passes through Celery's signal dispatch, which only catches Exception.
    sys.exit(EXIT_CONFIG)

"""``celery -A captcha_tasks worker|beat|flower|...`` refuses to start with a bad setting.

A wrong value, or a worker without ``CAPTCHAAI_API_KEY`` or with a key the API rejects (one
balance request at start-up per provider: ``getbalance``, or the JSON family's
``getBalance``), stops the process with one line naming the variable (exit 78,
sysexits' EX_CONFIG) before anything starts, the way the ``captcha-tasks`` command reports
it.  Outside the ``celery`` command (an app calling
``solve``, a framework's own worker) nothing happens here: the caller gets the
:class:`~captcha_tasks.errors.ConfigurationError` itself.
"""

from __future__ import annotations

import sys

import click
from celery import Celery

from ..errors import AuthError, CaptchaTasksError, ConfigurationError
from ..providers.inphp import Timeout
from ..providers.jsonapi import api_for
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
    if not settings.providers.api_key:
        return ConfigurationError(
            "CAPTCHAAI_API_KEY is not set: a worker needs the account key to call the API"
        )
    for spec in settings.providers.extra:
        if not spec.api_key:
            return ConfigurationError(
                f"CAPTCHAAI_PROVIDERS: provider {spec.name!r} reads its key from"
                f" {spec.key_env}, which is not set: a worker needs every provider's key"
            )
    return _key_refused(settings)


#: The start-up balance check waits at most this long: an API that is slow or down now must
#: not keep a worker from starting (its tasks retry), only a key it refuses.
_CHECK_TIMEOUT = Timeout(connect=3.0, read=5.0)


def _key_refused(settings: Settings) -> ConfigurationError | None:
    """The first provider (of all) that refuses its key, as an error naming the key's
    variable; an unreachable provider does not stop the worker (its circuit will say)."""
    timeout = Timeout(
        connect=min(settings.providers.connect_timeout, _CHECK_TIMEOUT.connect),
        read=min(settings.providers.read_timeout, _CHECK_TIMEOUT.read),
    )
    for spec in settings.providers.all:
        client = api_for(spec, timeout=timeout, pool_size=1)
        try:
            client.balance()
        except AuthError as exc:
            if spec.primary and spec.protocol == "in.php":
                return ConfigurationError(f"{exc.code}: {exc.message}")
            if spec.primary:
                return ConfigurationError(
                    f"CAPTCHAAI_API_KEY: provider {spec.name!r} refuses the key in"
                    f" {spec.key_env} ({exc.code}); check it and CAPTCHAAI_BASE_URL"
                )
            return ConfigurationError(
                f"CAPTCHAAI_PROVIDERS: provider {spec.name!r} refuses the key in"
                f" {spec.key_env} ({exc.code}); check it and the provider's base_url"
            )
        except CaptchaTasksError:
            continue  # unreachable or failing now: the tasks back off and retry
        finally:
            client.close()
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

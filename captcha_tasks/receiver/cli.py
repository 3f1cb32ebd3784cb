"""``captcha-tasks pingback-server`` and ``captcha-tasks pingback register``."""

from __future__ import annotations

import logging

import click

from ..errors import ConfigurationError
from ..serving.limits import Limits
from ..worker.app import app
from .callbacks import Receiver
from .server import serve

_DEFAULT = Limits()
_SECONDS = click.FloatRange(min=0, min_open=True)
_COUNT = click.IntRange(min=1)


@click.command("pingback-server")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8766, show_default=True, type=int)
@click.option("--log-level", default="WARNING", show_default=True)
@click.option(
    "--header-timeout",
    default=_DEFAULT.header_timeout,
    show_default=True,
    type=_SECONDS,
    help="Seconds a client has to send a request's headers.",
)
@click.option(
    "--body-timeout",
    default=_DEFAULT.body_timeout,
    show_default=True,
    type=_SECONDS,
    help="Seconds a client has to send a request's body.",
)
@click.option(
    "--max-connections",
    default=_DEFAULT.max_connections,
    show_default=True,
    type=_COUNT,
    help="Open connections in all (within the open-files limit).",
)
@click.option(
    "--max-per-address",
    default=_DEFAULT.max_per_address,
    show_default=True,
    type=_COUNT,
    help="Open connections from one address (trusted proxies excepted).",
)
@click.option(
    "--threads",
    default=_DEFAULT.judge_threads,
    show_default=True,
    type=_COUNT,
    help="Threads judging callbacks (Redis and Celery calls).",
)
def pingback_server(
    host: str,
    port: int,
    log_level: str,
    header_timeout: float,
    body_timeout: float,
    max_connections: int,
    max_per_address: int,
    threads: int,
) -> None:
    """Receive provider callbacks (CAPTCHAAI_PINGBACK_URL must lead here)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    limits = Limits(
        header_timeout=header_timeout,
        body_timeout=body_timeout,
        max_connections=max_connections,
        max_per_address=max_per_address,
        judge_threads=threads,
    )
    serve(Receiver(app.runtime().runner), host, port, limits)


@click.group()
def pingback() -> None:
    """Provider callbacks."""


@pingback.command()
@click.option("--url", default=None, help="Address to register (default: CAPTCHAAI_PINGBACK_URL).")
def register(url: str | None) -> None:
    """Register the callback address with the provider (2captcha requires it)."""
    runtime = app.runtime()
    address = url or runtime.settings.pingback.url
    if not address:
        raise ConfigurationError("CAPTCHAAI_PINGBACK_URL is not set (or pass --url)")
    runtime.api().add_pingback(address)
    click.echo(f"registered {address}")

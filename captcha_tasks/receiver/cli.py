"""``captcha-tasks pingback-server`` and ``captcha-tasks pingback register``."""

from __future__ import annotations

import click

from ..errors import ConfigurationError
from ..serving.limits import Limits
from ..serving.options import limit_options
from ..worker.app import app
from ..worker.redact import configure_logging
from .callbacks import Receiver
from .server import serve


@click.command("pingback-server")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8766, show_default=True, type=int)
@click.option("--log-level", default="WARNING", show_default=True)
@limit_options(
    header_help="Seconds a client has to send a request's headers.",
    threads_help="Threads judging callbacks (Redis and Celery calls).",
)
def pingback_server(
    host: str,
    port: int,
    log_level: str,
    limits: Limits,
) -> None:
    """Receive provider callbacks (CAPTCHAAI_PINGBACK_URL must lead here)."""
    configure_logging(log_level, app.settings)
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

"""``captcha-tasks gateway``."""

from __future__ import annotations

import click

from ..serving import Limits
from ..serving.options import limit_options
from ..worker.app import app
from ..worker.redact import configure_logging
from .server import serve, tls_context


@click.command("gateway")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8767, show_default=True, type=int)
@click.option("--certfile", default=None, help="PEM certificate (chain): serve HTTPS.")
@click.option("--keyfile", default=None, help="PEM private key (default: in --certfile).")
@click.option("--log-level", default="WARNING", show_default=True)
@limit_options(
    header_help="Seconds a client has for a TLS handshake, and for a request's headers.",
    threads_help="Threads answering requests (Redis and Celery calls; none waits for a solve).",
)
def gateway(
    host: str,
    port: int,
    certfile: str | None,
    keyfile: str | None,
    log_level: str,
    limits: Limits,
) -> None:
    """Serve the provider APIs (in.php/res.php, createTask/getTaskResult) to any SDK."""
    configure_logging(log_level, app.settings)
    if keyfile and not certfile:
        raise click.UsageError("--keyfile goes with --certfile")
    serve(host, port, limits, tls_context(certfile, keyfile) if certfile else None)

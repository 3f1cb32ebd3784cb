"""``captcha-tasks gateway``."""

from __future__ import annotations

import logging

import click

from ..serving import Limits
from .server import serve, tls_context

_DEFAULT = Limits()
_SECONDS = click.FloatRange(min=0, min_open=True)
_COUNT = click.IntRange(min=1)


@click.command("gateway")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8767, show_default=True, type=int)
@click.option("--certfile", default=None, help="PEM certificate (chain): serve HTTPS.")
@click.option("--keyfile", default=None, help="PEM private key (default: in --certfile).")
@click.option("--log-level", default="WARNING", show_default=True)
@click.option(
    "--header-timeout",
    default=_DEFAULT.header_timeout,
    show_default=True,
    type=_SECONDS,
    help="Seconds a client has for a TLS handshake, and for a request's headers.",
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
    help="Threads answering requests (Redis and Celery calls; none waits for a solve).",
)
def gateway(
    host: str,
    port: int,
    certfile: str | None,
    keyfile: str | None,
    log_level: str,
    header_timeout: float,
    body_timeout: float,
    max_connections: int,
    max_per_address: int,
    threads: int,
) -> None:
    """Serve the provider APIs (in.php/res.php, createTask/getTaskResult) to any SDK."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    if keyfile and not certfile:
        raise click.UsageError("--keyfile goes with --certfile")
    limits = Limits(
        header_timeout=header_timeout,
        body_timeout=body_timeout,
        max_connections=max_connections,
        max_per_address=max_per_address,
        judge_threads=threads,
    )
    serve(host, port, limits, tls_context(certfile, keyfile) if certfile else None)

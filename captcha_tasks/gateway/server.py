"""``captcha-tasks gateway``: the gateway on the HTTP server core every process facing the
internet shares (:mod:`captcha_tasks.serving`), plain or over TLS."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping

from ..errors import ConfigurationError
from ..serving import HttpServer, Limits, run
from ..worker.app import app
from .service import Gateway
from .site import GatewaySite
from .tenants import TenantKeys


def tls_context(certfile: str, keyfile: str | None = None) -> ssl.SSLContext:
    """A server TLS context from PEM files; :class:`ConfigurationError` when they cannot
    be read."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"--certfile/--keyfile cannot be used: {exc}") from None
    return context


class GatewayServer(HttpServer):
    """The gateway of this process's deployment on ``host:port`` (0 picks a free port),
    its tenants' keys read from ``environ`` (default: ``os.environ``)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: Limits | None = None,
        tls: ssl.SSLContext | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        runtime = app.runtime()
        keys = TenantKeys.from_settings(
            runtime.settings, os.environ if environ is None else environ
        )
        self.gateway = Gateway(runtime.state)
        super().__init__(GatewaySite(self.gateway, keys, runtime.settings), host, port, limits, tls)

    async def close(self) -> None:
        await super().close()
        self.gateway.state.gateway_stats.flush()


def serve(
    host: str, port: int, limits: Limits | None = None, tls: ssl.SSLContext | None = None
) -> None:
    """Serve the gateway in the foreground until Ctrl-C or SIGTERM."""
    run(
        GatewayServer(host, port, limits, tls),
        "gateway on {url} (in.php, res.php, createTask, ...)",
    )

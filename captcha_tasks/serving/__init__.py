"""The HTTP server core shared by the processes that face the internet: the pingback
receiver (:mod:`captcha_tasks.receiver`) and the gateway (:mod:`captcha_tasks.gateway`).

:class:`HttpServer` serves one :class:`Site` (who may call, and the answers) with the same
standard for both: a cap per address and in total and an allowlist applied before a byte
is read (:mod:`.limits`), deadlines for a TLS handshake, the headers and the body, bodies
over the site's limit never read, the client behind trusted reverse proxies
(:mod:`.addresses`), answers made on a bounded pool of threads.
"""

from .limits import Limits
from .server import HttpServer, Request, Response, Site, fit_to_open_files, run

__all__ = ["HttpServer", "Limits", "Request", "Response", "Site", "fit_to_open_files", "run"]

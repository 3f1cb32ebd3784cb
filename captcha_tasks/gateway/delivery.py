"""A client's own callback: the answer of a gateway captcha sent to the ``pingback`` or
``callbackUrl`` its tenant's ``callback_hosts`` allowed at submit.

* **When.**  The gateway links :func:`gateway_callback` to the solve (``link`` and
  ``link_error``, an immutable signature carrying only the gateway's id): the worker that
  completes the solve sends it as it runs every follow-up, owed in Redis until sent, so a
  crash between the answer and the call sends it again.  A token taken from a pool at
  submit is sent at once.  Every worker registers the task (``worker/config.py``).
* **What.**  The in.php face: a form ``POST`` of ``id=<id>&code=<token>`` (or
  ``code=<error code>`` for a failed captcha), as 2captcha's pingback; the JSON face: a
  JSON ``POST`` of ``getTaskResult``'s answer with ``taskId``, as Anti-Captcha's
  ``callbackUrl``.  The answer is read from the result backend at delivery: no token is
  in a task message.
* **How, safely.**  The URL is judged against the tenant's *current* ``callback_hosts``
  again; the host is resolved and every address judged
  (:func:`~captcha_tasks.core.callback_urls.address_allowed`), and the connection goes to
  the address judged (TLS still checks the host's certificate), so a DNS answer cannot
  change between the check and the call.  Connect and read time out
  (:data:`CONNECT_TIMEOUT_S`, :data:`READ_TIMEOUT_S`, :data:`DEADLINE_S` in all), a
  redirect is never followed (a ``3xx`` is a failure), at most :data:`MAX_RESPONSE`
  bytes of the reply are read.  A ``2xx`` delivers; a refused connection, a timeout, a
  ``5xx`` or a ``429`` is tried again after
  :data:`~captcha_tasks.core.callback_urls.RETRY_DELAYS_S`, then given up; anything else
  is given up at once.  Failures are logged with the id, the tenant, the host and why,
  never the token or the body.  Delivery is at least once: a worker killed after the
  client answered sends it again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlencode

import urllib3
from celery import Task

from .. import errors
from ..core import callback_urls
from ..core.callback_urls import Target
from ..worker import names
from ..worker.app import app
from ..worker.celery_compat.messages import OutageTask
from .inphp import text_of
from .jsonapi import task_result
from .service import JSON_FACE, Answer, Gateway

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 5.0
#: Seconds one try may take in all (a reply that trickles in is cut off).
DEADLINE_S = 10.0
#: Bytes of a client's reply read (the rest is dropped with the connection).
MAX_RESPONSE = 64 * 1024
USER_AGENT = "captcha-tasks-gateway"

Resolve = Callable[[str, int], Sequence[str]]


@dataclass(frozen=True)
class Failed:
    """A try that did not deliver: why (no token, no body), and whether to try again."""

    reason: str
    again: bool


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (an IP address: itself)."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in found))


@app.task(
    bind=True,
    base=OutageTask,
    name=names.GATEWAY_CALLBACK,
    ignore_result=True,
    max_retries=len(callback_urls.RETRY_DELAYS_S),
    shared=False,
)
def gateway_callback(self: Task, captcha_id: str) -> None:
    """Send the answer of gateway captcha ``captcha_id`` to its client's callback URL.

    Bound, and taking one argument: Celery sends such an error callback as a message (one
    taking more would be called in the completing process, with the failed request)."""
    tries = self.request.retries + 1
    failed = deliver(Gateway(app.runtime().state), captcha_id)
    if failed is None:
        return
    delay = callback_urls.retry_delay(tries) if failed.again else None
    if delay is None:
        log.warning(
            "callback of gateway captcha %s given up after %d tries: %s",
            captcha_id,
            tries,
            failed.reason,
        )
        return
    log.info(
        "callback of gateway captcha %s failed (%s): again in %ss", captcha_id, failed.reason, delay
    )
    raise self.retry(countdown=delay)


def deliver(gateway: Gateway, captcha_id: str, lookup: Resolve = resolve) -> Failed | None:
    """One try at sending ``captcha_id``'s answer to its callback URL; None when the
    client took it."""
    try:
        [ticket] = gateway.state.gateway.look_up([captcha_id])
        if ticket is None or ticket.callback is None:
            return Failed("no callback is known for it (expired?)", again=False)
        tenant = gateway.settings.tenants.get(ticket.tenant)
        judged = callback_urls.judge(ticket.callback, tenant.callback_hosts)
        if isinstance(judged, callback_urls.Refused):
            return Failed(f"{judged.reason} (tenant {tenant.name!r})", again=False)
        [answer] = gateway.answers(tenant, [captcha_id])
    except errors.StoreUnavailable:
        return Failed("Redis is away", again=True)
    if answer.state in ("pending", "unknown"):
        return Failed(f"its answer is {answer.state}", again=True)
    body, kind = message(captcha_id, ticket.face, answer)
    failed = post(judged, body, kind, lookup)
    if failed is not None:
        where = f"{judged.host}:{judged.port}"
        return Failed(f"{failed.reason} (tenant {tenant.name!r}, {where})", failed.again)
    return None


def message(captcha_id: str, face: str | None, answer: Answer) -> tuple[bytes, str]:
    """The body (and its type) a callback of ``face`` sends for ``answer``."""
    if face == JSON_FACE:
        data = {"taskId": int(captcha_id), **task_result(answer)}
        return json.dumps(data, separators=(",", ":")).encode(), "application/json"
    code = text_of(answer.token) if answer.state == "solved" else answer.code
    form = urlencode({"id": captcha_id, "code": code})
    return form.encode(), "application/x-www-form-urlencoded"


def post(target: Target, body: bytes, kind: str, lookup: Resolve = resolve) -> Failed | None:
    """``POST`` ``body`` to ``target`` (at an address judged allowed); None for a 2xx."""
    try:
        addresses = list(lookup(target.host, target.port))
    except (OSError, UnicodeError) as exc:
        return Failed(f"its host does not resolve ({type(exc).__name__})", again=True)
    refused = [a for a in addresses if not callback_urls.address_allowed(target, a)]
    if refused or not addresses:
        return Failed(f"its host resolves to an address not allowed ({refused[:1]})", again=False)
    pool = _pool(target, addresses[0])
    started = time.monotonic()
    try:
        reply = pool.urlopen(
            "POST",
            target.target,
            body=body,
            headers={"Host": target.host_header, "Content-Type": kind, "User-Agent": USER_AGENT},
            redirect=False,
            retries=False,
            assert_same_host=False,
            preload_content=False,
        )
        status = reply.status
        with contextlib.suppress(urllib3.exceptions.HTTPError, OSError):
            _drain(reply, started)  # the status is the answer; the rest is read to be polite
    except urllib3.exceptions.HTTPError as exc:
        return Failed(f"no answer ({type(exc).__name__})", again=True)
    finally:
        pool.close()
    if 200 <= status < 300:
        return None
    if 300 <= status < 400:
        return Failed(f"HTTP {status}: a redirect, not followed", again=False)
    return Failed(f"HTTP {status}", again=status >= 500 or status == 429)


def _pool(target: Target, address: str) -> urllib3.HTTPConnectionPool:
    timeout = urllib3.Timeout(connect=CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S)
    if target.scheme == "https":
        # Connect to the address judged; the certificate is checked against the host.
        hostname = None if target.literal else target.host
        return urllib3.HTTPSConnectionPool(
            address,
            target.port,
            timeout=timeout,
            maxsize=1,
            retries=False,
            server_hostname=hostname,
            assert_hostname=hostname or target.host,
        )
    return urllib3.HTTPConnectionPool(
        address, target.port, timeout=timeout, maxsize=1, retries=False
    )


def _drain(reply: urllib3.BaseHTTPResponse, started: float) -> None:
    """Read at most :data:`MAX_RESPONSE` bytes of the reply, within :data:`DEADLINE_S`."""
    taken = 0
    try:
        while taken < MAX_RESPONSE and time.monotonic() - started < DEADLINE_S:
            chunk = reply.read(min(8192, MAX_RESPONSE - taken), decode_content=False)
            if not chunk:
                break
            taken += len(chunk)
    finally:
        reply.close()

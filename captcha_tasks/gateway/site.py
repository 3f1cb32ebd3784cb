"""The gateway as a :class:`~captcha_tasks.serving.Site`: every request's path names its
protocol and endpoint, its key names its tenant, and the answer is the protocol's.

In this order, for every request:

1. a body over :data:`MAX_BODY` is refused (413) unread, by the server core;
2. the body is read (a form, multipart, JSON): unreadable → the protocol's error, 400;
3. an address that sent :data:`~.tenants.WRONG_KEYS_BURST` unknown keys lately is answered
   429 before its key is looked at; an unknown key is ``ERROR_KEY_DOES_NOT_EXIST``
   (``errorId`` 1);
4. a tenant over its ``requests_per_s`` is answered 429 (with ``Retry-After``);
5. the face answers (:mod:`.inphp`, :mod:`.jsonapi`); Redis away is the protocol's
   ``ERROR_SERVER_ERROR`` with a 503, any other failure too (logged, without the request).

Every request is counted by tenant, protocol and endpoint, with its error code and the
time its answer took (:class:`~captcha_tasks.state.gateway.GatewayStats`).  No key and
no token is ever logged.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import errors
from ..core.lanes import Tenant
from ..methods import MAX_IMAGE_BYTES
from ..serving import Request, Response, addresses
from ..settings import Settings
from . import inphp, jsonapi
from .forms import Unreadable, read_fields, read_json
from .replies import Reply
from .service import Gateway
from .tenants import TenantKeys

log = logging.getLogger(__name__)

#: Bytes of a request body: the largest image the API takes (1 MiB), as base64 (4/3 of
#: it), form-encoded (its ``+``, ``/`` and ``=`` as ``%XX``), with the other fields.
MAX_BODY = 2 * MAX_IMAGE_BYTES
#: Bytes of answers a client may leave unread: a bulk ``res.php`` of 100 tokens fits.
MAX_UNREAD = 2 * 1024 * 1024
#: Seconds a rate-limited client is asked to wait.
RETRY_AFTER_S = 1
IN_PHP, RES_PHP = "/in.php", "/res.php"
#: The 2captcha face's endpoints by path (``res.php``'s by its action: the metrics name
#: these, and ``other`` for anything a client makes up).
TWOCAPTCHA_PATHS = (IN_PHP, RES_PHP)
RES_PHP_ACTIONS = frozenset({"get", "getbalance", "reportbad", "reportgood", "threadsinfo"})
UNKNOWN_TENANT = "-"


@dataclass(frozen=True)
class _Call:
    protocol: str
    endpoint: str
    #: Answers the call for a tenant (after the key and the rate are checked).
    answer: Callable[[Tenant], Reply]
    #: The request's key.
    key: str
    as_json: bool


class GatewaySite:
    """The gateway's answers (thread-safe: :meth:`respond` runs on many threads)."""

    name = "gateway"
    max_body = MAX_BODY
    max_unread = MAX_UNREAD

    def __init__(self, gateway: Gateway, keys: TenantKeys, settings: Settings) -> None:
        self.gateway = gateway
        self.keys = keys
        self.trusted = settings.gateway.trusted_proxies
        self.allow = settings.gateway.allow
        self.stats = gateway.state.gateway_stats

    # -- who may call (on the event loop) --------------------------------------------------

    def allows(self, address: str) -> bool:
        return addresses.allowed(address, self.allow)

    def is_proxy(self, address: str) -> bool:
        return addresses.within(address, self.trusted)

    def client_address(self, peer: str, forwarded_for: Sequence[str]) -> str:
        return addresses.client_address(peer, forwarded_for, self.trusted)

    def refusal(self, status: int, reason: str) -> Response:
        code = "ERROR_IP_NOT_ALLOWED" if status == 403 else "ERROR_SERVER_ERROR"
        return Response.text(status, code)

    # -- answers (on the server's threads) -------------------------------------------------

    def respond(self, request: Request) -> Response:
        started = time.monotonic()
        protocol, endpoint = _where(request)
        tenant: Tenant | None = None
        try:
            call = self._call(request, protocol, endpoint)
            if isinstance(call, Reply):
                reply = call
            else:
                protocol, endpoint = call.protocol, call.endpoint
                tenant, reply = self._for_tenant(call, request.address)
        except errors.StoreUnavailable:
            log.warning("gateway %s %s: Redis is unavailable", protocol, endpoint)
            reply = _unavailable(protocol)
        except Exception as exc:  # a bug must still answer, and say nothing of the request
            where = traceback.extract_tb(exc.__traceback__)[-1]
            # the type and the place only: a message could hold a field, even a key
            log.error(
                "gateway %s %s failed: %s at %s:%s",
                protocol,
                endpoint,
                type(exc).__name__,
                where.filename,
                where.lineno,
            )
            reply = _unavailable(protocol)
        name = tenant.name if tenant is not None else UNKNOWN_TENANT
        self.stats.count(name, protocol, endpoint, reply.error, time.monotonic() - started)
        return reply.response

    def _call(self, request: Request, protocol: str, endpoint: str) -> _Call | Reply:
        """The call ``request`` makes, or the reply that refuses it before any key is read."""
        if request.body_size > MAX_BODY:
            return _refuse(protocol, "ERROR_TOO_BIG_CAPTCHA_FILESIZE", "the body is too large", 413)
        if request.method not in ("GET", "POST"):
            return _refuse(protocol, "ERROR_BAD_PARAMETERS", "GET or POST only", 405)
        if protocol == "json":
            return self._json_call(request, endpoint)
        if protocol != "2captcha":
            return Reply(Response.text(404, "not found"), "not_found")
        try:
            fields = read_fields(request)
        except Unreadable as exc:
            return _refuse(protocol, "ERROR_BAD_PARAMETERS", str(exc), 400)
        as_json = inphp.wants_json(fields.text)
        if endpoint == "in.php":

            def answer(tenant: Tenant) -> Reply:
                return inphp.in_php(self.gateway, tenant, fields.text, fields.files)

        else:
            action = fields.text.get("action", "")
            endpoint = f"res.php:{action if action in RES_PHP_ACTIONS else 'other'}"

            def answer(tenant: Tenant) -> Reply:
                return inphp.res_php(self.gateway, tenant, fields.text)

        return _Call(protocol, endpoint, answer, fields.text.get("key", ""), as_json)

    def _json_call(self, request: Request, endpoint: str) -> _Call | Reply:
        if request.method != "POST":
            return jsonapi.error("ERROR_BAD_PARAMETERS", "POST a JSON object", 405)
        try:
            body = read_json(request)
        except Unreadable as exc:
            return jsonapi.error("ERROR_BAD_PARAMETERS", str(exc), 400)
        handler = jsonapi.ENDPOINTS[endpoint]

        def answer(tenant: Tenant) -> Reply:
            return handler(self.gateway, tenant, body)

        key = body.get("clientKey")
        return _Call("json", endpoint, answer, key if isinstance(key, str) else "", True)

    def _for_tenant(self, call: _Call, address: str) -> tuple[Tenant | None, Reply]:
        if self.keys.guessing(address):
            return None, self._slow_down(call, "too many wrong keys from your address")
        tenant = self.keys.who(call.key)
        if tenant is None:
            self.keys.wrong_key(address)
            return None, _key_refused(call)
        if not self.keys.allow(tenant):
            return tenant, self._slow_down(call, "over this tenant's requests_per_s")
        return tenant, call.answer(tenant)

    def _slow_down(self, call: _Call, why: str) -> Reply:
        headers = (("Retry-After", str(RETRY_AFTER_S)),)
        if call.protocol == "json":
            return jsonapi.error("ERROR_TOO_MUCH_REQUESTS", why, 429, headers)
        return inphp.refusal("ERROR_TOO_MUCH_REQUESTS", call.as_json, why, 429, headers)


def _where(request: Request) -> tuple[str, str]:
    """The protocol and endpoint a request's path names."""
    path = request.path.rstrip("/") or "/"
    if path in TWOCAPTCHA_PATHS:
        return "2captcha", path.lstrip("/")
    name = path.lstrip("/")
    if name in jsonapi.ENDPOINTS:
        return "json", name
    return "none", "other"


def _refuse(protocol: str, code: str, message: str, status: int) -> Reply:
    if protocol == "json":
        return jsonapi.error(code, message, status)
    return inphp.refusal(code, False, message, status)


def _unavailable(protocol: str) -> Reply:
    return _refuse(protocol, "ERROR_SERVER_ERROR", "the service is unavailable: try again", 503)


def _key_refused(call: _Call) -> Reply:
    message = "no tenant has this key"
    if call.protocol == "json":
        return jsonapi.error("ERROR_KEY_DOES_NOT_EXIST", message)
    return inphp.refusal("ERROR_KEY_DOES_NOT_EXIST", call.as_json, message)

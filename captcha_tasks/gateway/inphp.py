"""The 2captcha / CaptchaAI face of the gateway: ``in.php`` and ``res.php``, form or
multipart fields (in the query or the body), answers as text or, with ``json=1``, JSON.

    POST /in.php   key=<tenant key>&method=turnstile&sitekey=...&pageurl=...   → OK|<id>
    GET  /res.php?key=...&action=get&id=<id>                                  → OK|<token>
    GET  /res.php?key=...&action=get&ids=<id>,<id>                            → a|b
    GET  /res.php?key=...&action=getbalance | reportbad&id= | reportgood&id= | threadsinfo

``in.php`` takes every method :mod:`captcha_tasks.methods` knows, with the field names the
provider's API uses (``googlekey``, ``gt``, ``captcha_id``, ``image_base64_1..9``, a
``file`` part for ``method=post``), ``lane`` (default ``interactive``), and ``pingback``:
a URL the tenant's ``callback_hosts`` allow, which gets ``id=<id>&code=<token or error
code>`` (a form ``POST``, as 2captcha sends it) when the answer is ready
(:mod:`.delivery`); any other is refused with ``ERROR_BAD_PARAMETERS`` and nothing is
submitted.  Fields are checked as ``solve.delay`` checks them; a bad one is answered with
the provider's error code (and our reason in ``error_text`` with ``json=1``).  A request
that cannot be read at all gets the same codes; nothing is answered with a 500.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from .. import errors
from ..core import callback_urls
from ..core.lanes import Tenant
from ..serving import Response
from .replies import Reply
from .service import IN_PHP_FACE, Answer, BudgetSpent, Callback, Gateway

#: Fields of the protocol, not of the captcha: read here, never passed to ``solve``.
PROTOCOL_FIELDS = frozenset({"key", "json", "method", "soft_id", "header_acao", "lane", "pingback"})
#: ``in.php``'s name of the public ``sitekey``, by method.
SITEKEY_FIELDS = {"userrecaptcha": "googlekey", "geetest": "gt", "lemin": "captcha_id"}
#: Other field names the provider's API (or its SDKs) use for our parameters.
RENAMED = {"apiServer": "api_server", "user_agent": "userAgent"}
#: Most ids one ``res.php?action=get&ids=`` may ask for (the provider's limit).
MAX_BULK_IDS = 100
#: The code of a ``pingback`` the tenant's ``callback_hosts`` do not allow (or that cannot
#: be read): the request is wrong, as 2captcha's SDKs take ``ERROR_BAD_PARAMETERS``.
CALLBACK_REFUSED = "ERROR_BAD_PARAMETERS"
_BLS_FIELDS = tuple(f"image_base64_{n}" for n in range(1, 10))
_JSON = "application/json"


class Refused(Exception):
    """A request answered with a provider error ``code`` (``message``: why, in our words)."""

    def __init__(self, code: str, message: str = "", status: int = 200) -> None:
        super().__init__(code)
        self.code, self.message, self.status = code, message or code, status


def wants_json(fields: Mapping[str, str]) -> bool:
    return fields.get("json", "").strip().lower() in ("1", "true")


def ok(value: Any, as_json: bool, text: str | None = None, **extra: Any) -> Reply:
    """A success: ``OK|value`` (or ``text``), or ``{"status": 1, "request": value}``."""
    if as_json:
        body = json.dumps({"status": 1, "request": value, **extra}, separators=(",", ":"))
        return Reply(Response(200, body.encode(), _JSON))
    return Reply(Response.text(200, text if text is not None else f"OK|{value}"))


def refusal(
    code: str,
    as_json: bool,
    message: str = "",
    status: int = 200,
    headers: tuple[tuple[str, str], ...] = (),
) -> Reply:
    """An error as the provider answers it: the code alone, or ``{"status": 0, ...}``
    (with our reason as ``error_text``)."""
    if as_json:
        data = {"status": 0, "request": code, "error_text": message or code}
        body = json.dumps(data, separators=(",", ":")).encode()
        return Reply(Response(status, body, _JSON, headers), code)
    return Reply(Response(status, code.encode(), "text/plain", headers), code)


# -- in.php --------------------------------------------------------------------------------


def submit_fields(fields: Mapping[str, str], files: Mapping[str, bytes]) -> dict[str, Any]:
    """``solve``'s keyword arguments for an ``in.php`` request (its method named as the
    provider names it); :class:`Refused` when there is no method to read."""
    method = fields.get("method", "").strip()
    if not method:
        raise Refused("ERROR_BAD_PARAMETERS", "method is required")
    if "tenant" in fields:
        raise Refused("ERROR_BAD_PARAMETERS", "the key names the tenant: leave out tenant")
    kwargs: dict[str, Any] = {
        RENAMED.get(k, k): v for k, v in fields.items() if k not in PROTOCOL_FIELDS
    }
    if method == "post":  # an image uploaded as a file part
        upload = files.get("file")
        if upload is None:
            raise Refused("ERROR_ZERO_CAPTCHA_FILESIZE", "method=post needs a file part")
        kwargs["body"] = base64.b64encode(upload).decode("ascii")
        method = "base64"
    if method == "base64" and "grid_size" in kwargs:
        method = "grid"  # CaptchaAI's grid: an image with grid_size and instructions
    if method == "bls":
        images = [kwargs.pop(name) for name in _BLS_FIELDS if name in kwargs]
        kwargs["images"] = images
    sitekey_field = SITEKEY_FIELDS.get(method)
    if sitekey_field is not None and sitekey_field in kwargs:
        kwargs["sitekey"] = kwargs.pop(sitekey_field)
    kwargs["method"] = method
    return kwargs


def in_php(
    gateway: Gateway, tenant: Tenant, fields: Mapping[str, str], files: Mapping[str, bytes]
) -> Reply:
    as_json = wants_json(fields)
    callback = None
    pingback = fields.get("pingback", "").strip()
    if pingback:
        judged = callback_urls.judge(pingback, tenant.callback_hosts)
        if isinstance(judged, callback_urls.Refused):
            return refusal(CALLBACK_REFUSED, as_json, f"pingback refused: {judged.reason}")
        callback = Callback(judged.url, IN_PHP_FACE)
    kwargs: dict[str, Any] = {}
    try:
        kwargs = submit_fields(fields, files)
        captcha_id = gateway.submit(tenant, kwargs, fields.get("lane") or None, callback)
    except Refused as exc:
        return refusal(exc.code, as_json, exc.message, exc.status)
    except BudgetSpent as exc:
        return refusal(exc.code, as_json, exc.message)
    except errors.ValidationError as exc:
        return refusal(validation_code(exc, kwargs.get("method")), as_json, exc.message)
    return ok(captcha_id, as_json)


def validation_code(exc: errors.ValidationError, method: Any) -> str:
    """The provider's code for a request ``solve.delay`` would refuse with ``exc``."""
    message = exc.message
    if "image" in message or message.startswith("body"):
        if "at least" in message:
            return "ERROR_ZERO_CAPTCHA_FILESIZE"
        if "at most" in message:
            return "ERROR_TOO_BIG_CAPTCHA_FILESIZE"
        return "ERROR_IMAGE_TYPE_NOT_SUPPORTED"
    if message.startswith("pageurl"):
        return "ERROR_PAGEURL"
    if message.startswith("sitekey") and method == "userrecaptcha":
        return "ERROR_GOOGLEKEY"
    return "ERROR_BAD_PARAMETERS"


# -- res.php -------------------------------------------------------------------------------


def res_php(gateway: Gateway, tenant: Tenant, fields: Mapping[str, str]) -> Reply:
    as_json = wants_json(fields)
    action = fields.get("action", "").strip()
    try:
        if action == "get":
            return _get(gateway, tenant, fields, as_json)
        if action == "getbalance":
            balance = f"{gateway.balance(tenant):.2f}"
            return ok(balance, as_json, text=balance)
        if action in ("reportbad", "reportgood"):
            captcha_id = _one_id(fields.get("id", ""))
            if not gateway.report(tenant, captcha_id, good=action == "reportgood"):
                raise Refused("ERROR_WRONG_CAPTCHA_ID", "no solved captcha has this id")
            return ok("OK_REPORT_RECORDED", as_json, text="OK_REPORT_RECORDED")
        if action == "threadsinfo":
            return _threads(gateway, tenant, as_json)
    except Refused as exc:
        return refusal(exc.code, as_json, exc.message, exc.status)
    if not action:
        return refusal("ERROR_EMPTY_ACTION", as_json, "action is required")
    return refusal("ERROR_BAD_PARAMETERS", as_json, f"this gateway has no action {action[:40]!r}")


def _one_id(raw: str) -> str:
    captcha_id = raw.strip()
    if not captcha_id.isdigit() or len(captcha_id) > 16:
        raise Refused("ERROR_WRONG_ID_FORMAT", "a captcha id is a number")
    return captcha_id


def _get(gateway: Gateway, tenant: Tenant, fields: Mapping[str, str], as_json: bool) -> Reply:
    if "ids" in fields:
        ids = [_one_id(part) for part in fields["ids"].split(",") if part.strip()]
        if not ids or len(ids) > MAX_BULK_IDS:
            raise Refused("ERROR_BAD_PARAMETERS", f"ids takes 1 to {MAX_BULK_IDS} ids")
        joined = "|".join(_bulk_item(a) for a in gateway.answers(tenant, ids))
        return ok(joined, as_json, text=joined)
    [answer] = gateway.answers(tenant, [_one_id(fields.get("id", ""))])
    if answer.state != "solved":
        return refusal(answer.code, as_json, answer.message)
    return solved(answer, as_json)


def solved(answer: Answer, as_json: bool) -> Reply:
    """A solved captcha's answer: its token (an object or a list as JSON), and the user
    agent it must be used with, as CaptchaAI and 2captcha send them."""
    token = answer.token
    if not as_json:
        return Reply(Response.text(200, f"OK|{text_of(token)}"))
    agent = answer.user_agent
    if agent is None:
        return ok(token, True)
    # CaptchaAI puts such an answer in `result` too; 2captcha names the agent `useragent`
    return ok(token, True, result=token, user_agent=agent, useragent=agent)


def text_of(token: Any) -> str:
    """A token as ``res.php`` answers it in text (an object or a list as JSON)."""
    return token if isinstance(token, str) else json.dumps(token, separators=(",", ":"))


def _bulk_item(answer: Answer) -> str:
    return text_of(answer.token) if answer.state == "solved" else answer.code


def _threads(gateway: Gateway, tenant: Tenant, as_json: bool) -> Reply:
    view = gateway.threads(tenant)
    if as_json:  # CaptchaAI: the counts are top-level fields
        data = {
            "status": 1,
            "threads": view.threads,
            "working_threads": view.working,
            "free_threads": view.free,
        }
        return Reply(Response(200, json.dumps(data, separators=(",", ":")).encode(), _JSON))
    text = f"threads={view.threads}|working_threads={view.working}|free_threads={view.free}"
    return Reply(Response.text(200, text))

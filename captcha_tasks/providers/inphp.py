"""HTTP client for the CaptchaAI API (2captcha-compatible ``in.php`` / ``res.php``).

It only speaks HTTP: each call turns a reply into a value or a typed exception from
:mod:`captcha_tasks.errors`.  What to do next (retry, resubmit, give up) is the tasks'
business.  "Not ready yet" is the value :data:`NOT_READY`.

Replies are read in both dialects: CaptchaAI's (the answer in ``result`` with a
``user_agent`` for some methods; ``threadsinfo`` counts as top-level fields) and 2captcha's
(everything in ``request``).

Every request is a POST so the API key travels in the body, never in a URL that could
end up in an exception message or a proxy log.

It talks HTTP through urllib3 (the library under requests) directly: every captcha costs
an ``in.php`` call on a worker, and requests' per-call preparation cost more CPU than the
rest of the submit.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import urllib3

from .. import errors
from ..core.answers import NOT_READY, Answer, NotReady
from ..methods import SolveRequest

NOT_READY_TEXT = "CAPCHA_NOT_READY"
BULK_MAX_IDS = 100


@dataclass(frozen=True)
class Timeout:
    """Connect and read timeouts in seconds."""

    connect: float = 5.0
    read: float = 30.0


class ProviderAPI(Protocol):
    """What the worker asks of one provider's API, whichever protocol it speaks: this
    module's :class:`CaptchaAIClient` (``in.php`` / ``res.php``) and
    :class:`captcha_tasks.providers.jsonapi.JSONClient` (``createTask`` / ``getTaskResult``)."""

    def submit(self, request: SolveRequest, pingback: str | None = None) -> str: ...

    def answered(self, captcha_id: str) -> Answer | None:
        """The answer that came with the submit of ``captcha_id`` (taken once), if any."""
        ...

    def get(self, captcha_id: str) -> Answer | NotReady: ...

    def get_many(
        self, captcha_ids: Sequence[str]
    ) -> dict[str, Answer | NotReady | Exception] | None: ...

    def balance(self) -> float: ...

    def report(self, captcha_id: str, *, good: bool, method: str | None = None) -> None: ...

    def threads_info(self) -> dict[str, int] | None: ...

    def add_pingback(self, url: str) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Reply:
    """A parsed API reply: ``ok`` with its ``request`` value, or an error/not-ready code."""

    ok: bool
    request: Any
    #: The other top-level fields of a JSON reply (``result``, ``user_agent``, ``threads``).
    fields: Mapping[str, Any] = field(default_factory=dict)


class CaptchaAIClient:
    """A client for one API key, holding one pool of keep-alive connections."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: Timeout | None = None,
        pool_size: int = 32,
        soft_id: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        #: Sent as ``soft_id`` with every submit (the provider's developer program).
        self.soft_id = soft_id
        self.timeout = timeout or Timeout()
        self._http = pool_manager(self.base_url, pool_size)

    def __repr__(self) -> str:
        return f"CaptchaAIClient(base_url={self.base_url!r}, api_key=***)"

    def close(self) -> None:
        self._http.clear()

    # -- calls -----------------------------------------------------------------------
    def submit(self, request: SolveRequest, pingback: str | None = None) -> str:
        """Submit a captcha; returns its captcha id.  ``pingback``: the URL the provider
        calls when it is done (see :mod:`captcha_tasks.core.pingback`)."""
        fields = request.api_fields()
        if pingback is not None:
            fields["pingback"] = pingback
        if self.soft_id is not None:
            fields["soft_id"] = self.soft_id
        reply = self._call("in.php", fields)
        if not reply.ok:
            raise _error(reply.request)
        return str(reply.request)

    def answered(self, captcha_id: str) -> Answer | None:
        """``in.php`` never answers at submit: None."""
        return None

    def get(self, captcha_id: str) -> Answer | NotReady:
        """One captcha's answer, or :data:`NOT_READY`."""
        reply = self._call("res.php", {"action": "get", "id": captcha_id})
        if reply.ok:
            return _answer(reply)
        if reply.request == NOT_READY_TEXT:
            return NOT_READY
        raise _error(reply.request, captcha_id)

    def get_many(
        self, captcha_ids: Sequence[str]
    ) -> dict[str, Answer | NotReady | Exception] | None:
        """Answers of several pipe-safe captchas in one request (``ids=``).

        Returns ``None`` when the server does not honour ``ids`` (the caller falls back to
        one id per request).  Each value is a token, :data:`NOT_READY` or the exception
        for that captcha's error code.  Only plain tokens fit: a bulk reply has no room for
        structured answers or a user agent.
        """
        if not captcha_ids or len(captcha_ids) > BULK_MAX_IDS:
            raise ValueError(f"get_many takes 1 to {BULK_MAX_IDS} ids")
        reply = self._call("res.php", {"action": "get", "ids": ",".join(captcha_ids)})
        if not isinstance(reply.request, str):
            return None
        parts = reply.request.split("|")
        if reply.request.startswith("OK|") and len(parts) == len(captcha_ids) + 1:
            parts = parts[1:]
        if len(parts) != len(captcha_ids) or _looks_unsupported(reply, parts):
            return None
        return {cid: _bulk_value(part, cid) for cid, part in zip(captcha_ids, parts, strict=True)}

    def balance(self) -> float:
        """The account balance."""
        reply = self._call("res.php", {"action": "getbalance"})
        if not reply.ok and str(reply.request).startswith("ERROR"):
            raise _error(reply.request)
        try:
            return float(reply.request)
        except (TypeError, ValueError):
            raise errors.TransportError(f"unexpected balance reply {reply.request!r}") from None

    def report(self, captcha_id: str, *, good: bool, method: str | None = None) -> None:
        """Tell the API whether a solved answer worked (``reportgood`` / ``reportbad``;
        ``method`` changes nothing here)."""
        action = "reportgood" if good else "reportbad"
        reply = self._call("res.php", {"action": action, "id": captcha_id})
        if not reply.ok and reply.request != "OK_REPORT_RECORDED":
            raise _error(reply.request, captcha_id)

    def add_pingback(self, url: str) -> None:
        """Register a callback address with the provider (2captcha requires this before
        it calls a ``pingback`` URL; the address registered is the base of our URLs)."""
        reply = self._call("res.php", {"action": "add_pingback", "addr": url})
        if not reply.ok:
            raise _error(reply.request)

    def threads_info(self) -> dict[str, int] | None:
        """CaptchaAI's thread usage ``{"threads": N, "working_threads": M}``, if answered.

        CaptchaAI sends the counts as top-level fields; a ``request``-wrapped reply (object
        or ``threads=N|working_threads=M`` text) is read too."""
        try:
            reply = self._call("res.php", {"action": "threadsinfo"})
        except errors.FatalError:
            return None
        if not reply.ok:
            return None
        return _threads(reply.fields) or _threads(reply.request)

    # -- plumbing --------------------------------------------------------------------
    def _call(self, endpoint: str, fields: dict[str, Any]) -> Reply:
        data = {k: str(v) for k, v in fields.items()}
        data.update(key=self._api_key, json="1")
        url = f"{self.base_url}/{endpoint}"
        try:
            resp = self._http.request(
                "POST",
                url,
                fields=data,
                encode_multipart=False,
                timeout=urllib3.Timeout(connect=self.timeout.connect, read=self.timeout.read),
                retries=False,
            )
        except urllib3.exceptions.TimeoutError:
            raise errors.TransportError(f"{endpoint}: timed out") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise errors.TransportError(f"{endpoint}: {type(exc).__name__}") from None
        if resp.status == 429:
            wait = retry_after(resp.headers.get("Retry-After"))
            raise errors.RateLimited(
                f"{endpoint}: HTTP 429, retry after {wait:g} s", retry_after=wait
            )
        body = resp.data.decode("utf-8", errors="replace")
        return parse_reply(resp.status, body, endpoint)


#: Seconds to wait after a 429 that says nothing (or nonsense) in ``Retry-After``.
DEFAULT_RETRY_AFTER = errors.DEFAULT_RETRY_AFTER
#: Longest wait a ``Retry-After`` is believed for.
MAX_RETRY_AFTER = 600.0


def retry_after(value: str | None) -> float:
    """Seconds a ``Retry-After`` header asks for (delta seconds or an HTTP date)."""
    if not value:
        return DEFAULT_RETRY_AFTER
    value = value.strip()
    if value.isdigit():
        return min(MAX_RETRY_AFTER, float(value))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return DEFAULT_RETRY_AFTER
    return min(MAX_RETRY_AFTER, max(0.0, when.timestamp() - time.time()))


def parse_reply(status: int, body: str, endpoint: str = "API") -> Reply:
    """Turn one HTTP reply into a :class:`Reply`, or raise a retryable transport error.

    Understands JSON (``json=1``) and text (``OK|...``, ``ERROR_...``) bodies.
    """
    text = body.strip()
    if status >= 500:
        raise errors.TransportError(f"{endpoint}: HTTP {status}")
    if not text:
        raise errors.TransportError(f"{endpoint}: empty reply (HTTP {status})")
    if text.startswith("<"):
        raise errors.TransportError(f"{endpoint}: HTML page instead of an answer (HTTP {status})")
    if text.startswith("{"):
        return _parse_json(text, endpoint)
    return _parse_text(text, status, endpoint)


def _parse_json(text: str, endpoint: str) -> Reply:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise errors.TransportError(f"{endpoint}: malformed JSON reply") from None
    if not isinstance(data, dict) or "status" not in data:
        raise errors.TransportError(f"{endpoint}: JSON reply without status")
    others = {k: v for k, v in data.items() if k not in ("status", "request")}
    return Reply(data.get("status") == 1, data.get("request"), others)


def _parse_text(text: str, status: int, endpoint: str) -> Reply:
    if text.startswith("OK|"):
        return Reply(True, text[3:])
    if text == NOT_READY_TEXT or text.startswith(("ERROR", "MAX_USER_TURN", "IP_BANNED")):
        return Reply(False, text.split("|", 1)[0])
    if status >= 400:
        raise errors.TransportError(f"{endpoint}: HTTP {status}")
    # Bare values: a balance ("1.234"), OK_REPORT_RECORDED, a bulk reply.
    return Reply(True, text)


def _error(code: Any, captcha_id: str | None = None) -> errors.CaptchaTasksError:
    if not isinstance(code, str) or not code:
        return errors.TransportError(f"unexpected reply {code!r}", captcha_id=captcha_id)
    return errors.from_api_code(code, captcha_id)


def _answer(reply: Reply) -> Answer:
    # CaptchaAI puts some methods' answers in ``result`` (reCAPTCHA Enterprise, the
    # Cloudflare challenge); 2captcha and the other methods use ``request``.
    value = reply.fields.get("result")
    if value is None or value == "":
        value = reply.request
    if not isinstance(value, str | dict | list):
        raise errors.TransportError(f"unexpected answer type {type(value).__name__}")
    agent = reply.fields.get("user_agent")
    return Answer(value, agent if isinstance(agent, str) and agent else None)


def _bulk_value(part: str, captcha_id: str) -> Answer | NotReady | errors.CaptchaTasksError:
    if part == NOT_READY_TEXT:
        return NOT_READY
    if part.startswith("ERROR") or part in ("MAX_USER_TURN", "IP_BANNED"):
        return errors.from_api_code(part, captcha_id)
    return Answer(part)


def callback_answer(code: str, captcha_id: str) -> Answer | NotReady | errors.CaptchaTasksError:
    """A provider callback's ``code``: an answer (a JSON object's text becomes the object),
    an API error, or :data:`NOT_READY`."""
    if code.startswith("{"):
        try:
            value = json.loads(code)
        except ValueError:
            return Answer(code)
        return Answer(value if isinstance(value, dict) else code)
    return _bulk_value(code, captcha_id)


def _looks_unsupported(reply: Reply, parts: list[str]) -> bool:
    # A server that ignores ``ids`` answers as for a missing ``id``.
    if reply.ok:
        return False
    return len(parts) == 1 and parts[0] != NOT_READY_TEXT


def _threads(value: Any) -> dict[str, int] | None:
    if isinstance(value, Mapping):
        items: Iterable[tuple[str, Any]] = value.items()
    elif isinstance(value, str) and "=" in value:
        items = (p.split("=", 1) for p in value.split("|") if "=" in p)  # type: ignore[misc]
    else:
        return None
    info: dict[str, int] = {}
    for name, count in items:
        try:
            info[str(name)] = int(count)
        except (TypeError, ValueError):
            continue  # another field of the reply (error_text, ...)
    return info if "threads" in info else None


def pool_manager(base_url: str, pool_size: int) -> urllib3.PoolManager:
    """One connection pool per host; the proxy variables (``HTTPS_PROXY``, ``NO_PROXY``)
    are read once here."""
    headers = {"User-Agent": "captcha-tasks/0.1"}
    host = urllib3.util.parse_url(base_url).host or ""
    proxy = urllib.request.getproxies().get(urllib3.util.parse_url(base_url).scheme or "")
    if proxy and not urllib.request.proxy_bypass(host):
        return urllib3.ProxyManager(proxy, num_pools=4, maxsize=pool_size, headers=headers)
    return urllib3.PoolManager(num_pools=4, maxsize=pool_size, headers=headers)

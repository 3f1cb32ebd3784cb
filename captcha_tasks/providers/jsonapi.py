"""HTTP client for the JSON family of captcha APIs (``createTask`` / ``getTaskResult``):
Anti-Captcha, CapSolver, CapMonster Cloud; each spoken through its
:class:`~captcha_tasks.core.dialects.Dialect`.

The same interface as :class:`captcha_tasks.providers.inphp.CaptchaAIClient`
(:class:`~captcha_tasks.providers.inphp.ProviderAPI`: ``submit`` -> id, ``answered`` -> the answer
that came with it, ``get`` / ``get_many`` -> answer, :data:`NOT_READY` or a typed error,
``balance``, ``report``); :func:`api_for` builds the one a provider's kind speaks.
:func:`parse_task_reply` is pure: "not ready" is a value, an ``errorId > 0`` becomes the
exception of :mod:`captcha_tasks.errors` its code maps to.  The key travels in the JSON
body only.

Per-task state (the poll budgets, the answers ``createTask`` held, each task's method) is
this process's: the worker polls a task from any process, and the budgets hold per process.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import urllib3

from .. import errors
from ..core.answers import NOT_READY, Answer, NotReady
from ..core.dialects import DIALECTS, Dialect, build_task
from ..core.providers import ProviderSpec
from ..methods import SolveRequest
from .inphp import (
    CaptchaAIClient,
    ProviderAPI,
    Timeout,
    callback_answer,
    pool_manager,
    retry_after,
)

#: The ``solution`` fields that hold a token or text, in the order they are looked for
#: (CapMonster's cf_clearance; CapSolver's is in ``cookies``, before its ``token``).
_SOLUTION_FIELDS = ("gRecaptchaResponse", "cf_clearance", "cookies.cf_clearance", "token", "text")
#: GeeTest v3's answer as the family names its fields -> as in.php names them: a caller
#: reads one shape whichever provider solved the captcha.
_GEETEST_NAMES = {
    "challenge": "geetest_challenge",
    "validate": "geetest_validate",
    "seccode": "geetest_seccode",
}


def parse_body(status: int, body: str, endpoint: str) -> dict[str, Any]:
    """One HTTP reply as its JSON object, or a retryable transport error."""
    if status >= 500:
        raise errors.TransportError(f"{endpoint}: HTTP {status}")
    try:
        data = json.loads(body)
    except ValueError:
        raise errors.TransportError(f"{endpoint}: no JSON in the reply (HTTP {status})") from None
    if not isinstance(data, dict) or "errorId" not in data:
        raise errors.TransportError(f"{endpoint}: JSON reply without errorId")
    return data


def api_error(dialect: Dialect, data: dict[str, Any], task_id: str | None = None) -> Exception:
    """The typed exception for a reply whose ``errorId`` is not 0."""
    code = data.get("errorCode")
    if not isinstance(code, str) or not code:
        return errors.UnknownAPIError(f"errorId {data.get('errorId')!r}", None, task_id)
    return errors.from_api_code(dialect.in_php_code(code), task_id)


#: Tasks a client keeps per-task state for: the oldest goes first (a task moved to another
#: provider, or polled from another process, is never answered here).
TASKS_KEPT = 100_000

K = TypeVar("K")
V = TypeVar("V")


def _remember(kept: dict[K, V], key: K, value: V) -> None:
    kept.pop(key, None)
    kept[key] = value
    while len(kept) > TASKS_KEPT:
        del kept[next(iter(kept))]


def api_for(
    spec: ProviderSpec,
    *,
    timeout: Timeout | None = None,
    pool_size: int = 32,
    soft_id: str | None = None,
) -> ProviderAPI:
    """The API client of ``spec``: its kind's protocol, its ``base_url`` and key."""
    dialect = DIALECTS.get(spec.kind)
    if dialect is None:
        return CaptchaAIClient(
            spec.base_url, spec.api_key, timeout=timeout, pool_size=pool_size, soft_id=soft_id
        )
    return JSONClient(
        spec.base_url, spec.api_key, dialect, timeout=timeout, pool_size=pool_size, soft_id=soft_id
    )


def _cost(data: dict[str, Any]) -> float | None:
    cost = data.get("cost")
    if isinstance(cost, bool) or not isinstance(cost, str | int | float):
        return None
    try:
        return float(cost)
    except ValueError:
        return None


def parse_task_reply(
    dialect: Dialect, data: dict[str, Any], task_id: str | None = None
) -> Answer | NotReady | Exception:
    """A ``getTaskResult`` (or synchronous ``createTask``) reply as a value (its ``cost``
    in the answer, where the provider gives one)."""
    if data.get("errorId"):
        return api_error(dialect, data, task_id)
    status = data.get("status")
    if status in dialect.pending_statuses:
        return NOT_READY
    if status != "ready":
        return errors.TransportError(f"unexpected task status {status!r}", None, task_id)
    solution = data.get("solution")
    if not isinstance(solution, dict):
        return errors.TransportError("ready without a solution", None, task_id)
    agent = solution.get("userAgent")
    agent = agent if isinstance(agent, str) and agent else None
    return Answer(_solution_value(solution), agent, _cost(data))


def _solution_value(solution: dict[str, Any]) -> Any:
    for name in _SOLUTION_FIELDS:
        outer, dot, inner = name.partition(".")
        value = solution.get(outer)
        if dot:
            value = value.get(inner) if isinstance(value, dict) else None
        if isinstance(value, str) and value:
            return value
    rest = {k: v for k, v in solution.items() if k != "userAgent"}
    if set(rest) == set(_GEETEST_NAMES):
        return {_GEETEST_NAMES[k]: v for k, v in rest.items()}
    return rest


def callback_reading(
    kind: str, code: str, captcha_id: str
) -> Answer | NotReady | errors.CaptchaTasksError:
    """What a callback from a provider of ``kind`` says about ``captcha_id``, as a poll
    reading: an in.php kind's ``code``, or a JSON kind's ``getTaskResult`` body (see
    :func:`captcha_tasks.core.pingback.read_json_callback`)."""
    dialect = DIALECTS.get(kind)
    if dialect is None:
        return callback_answer(code, captcha_id)
    try:
        data = json.loads(code)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return errors.TransportError("a callback body that is not JSON", None, captcha_id)
    value = parse_task_reply(dialect, data, captcha_id)
    if isinstance(value, Exception) and not isinstance(value, errors.CaptchaTasksError):
        return errors.TransportError(type(value).__name__, None, captcha_id)
    return value


class JSONClient:
    """A client for one key at one JSON provider, one pool of keep-alive connections."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        dialect: Dialect,
        *,
        timeout: Timeout | None = None,
        pool_size: int = 32,
        soft_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.dialect = dialect
        self.soft_id = soft_id
        self.timeout = timeout or Timeout()
        self._clock = clock
        self._http = pool_manager(self.base_url, pool_size)
        #: Task id -> (polls so far, time of the last poll): the dialect's poll budgets.
        self._polls: dict[str, tuple[int, float]] = {}
        #: Answers that came with ``createTask`` (synchronous methods).
        self._ready: dict[str, Answer] = {}
        #: Task id -> its method (the report endpoint depends on it).
        self._methods: dict[str, str] = {}
        #: The last answer's ``cost``, where the provider gives it.
        self.last_cost: float | None = None

    def __repr__(self) -> str:
        return f"JSONClient(kind={self.dialect.kind!r}, base_url={self.base_url!r}, api_key=***)"

    def close(self) -> None:
        self._http.clear()

    def submit(self, request: SolveRequest, pingback: str | None = None) -> str:
        """``createTask``; returns the task id as text."""
        payload: dict[str, Any] = {"task": build_task(self.dialect, request)}
        if pingback is not None and self.dialect.callback_field is not None:
            payload[self.dialect.callback_field] = pingback
        if self.soft_id is not None:
            payload[self.dialect.app_id_field] = self.soft_id
        data = self._call("createTask", payload)
        if data.get("errorId"):
            raise api_error(self.dialect, data)
        task_id = str(data.get("taskId", ""))
        if not task_id:
            raise errors.TransportError("createTask: no taskId in the reply")
        _remember(self._methods, task_id, request.method)
        if request.method in self.dialect.synchronous and data.get("status") == "ready":
            value = parse_task_reply(self.dialect, data, task_id)
            if isinstance(value, Answer):
                _remember(self._ready, task_id, value)
        return task_id

    def answered(self, captcha_id: str) -> Answer | None:
        """The answer ``createTask`` held for ``captcha_id`` (a synchronous method), once."""
        answer = self._ready.pop(captcha_id, None)
        if answer is not None:
            self._methods.pop(captcha_id, None)
        return answer

    def get(self, captcha_id: str) -> Answer | NotReady:
        """One task's answer, or :data:`NOT_READY` (also while its poll gap runs)."""
        value = self._poll(captcha_id)
        if isinstance(value, Exception):
            raise value
        return value

    def get_many(
        self, captcha_ids: Sequence[str]
    ) -> dict[str, Answer | NotReady | Exception] | None:
        """One ``getTaskResult`` per id, within the dialect's budgets."""
        return {cid: self._poll(cid) for cid in captcha_ids}

    def balance(self) -> float:
        data = self._call("getBalance", {})
        if data.get("errorId"):
            raise api_error(self.dialect, data)
        try:
            return float(data["balance"])
        except (KeyError, TypeError, ValueError):
            raise errors.TransportError("getBalance: no balance in the reply") from None

    def report(self, captcha_id: str, *, good: bool, method: str | None = None) -> None:
        """Tell the provider whether an answer worked, where its dialect can (``method``:
        the captcha's, when this process did not submit it: images have their own
        endpoint)."""
        image = (method or self._methods.get(captcha_id)) == "base64"
        d = self.dialect
        endpoint = (
            d.report_good_token if good else (d.report_bad_image if image else d.report_bad_token)
        )
        if endpoint is None or (good and image):
            return
        payload: dict[str, Any] = {"taskId": self._task_id(captcha_id)}
        if endpoint == "feedbackTask":
            payload["result"] = {"invalid": not good}
        data = self._call(endpoint, payload)
        if data.get("errorId"):
            raise api_error(d, data, captcha_id)

    def threads_info(self) -> dict[str, int] | None:
        return None

    def add_pingback(self, url: str) -> None:
        """Nothing to register: the family takes a ``callbackUrl`` with each task."""

    # -- plumbing --------------------------------------------------------------------
    def _poll(self, captcha_id: str) -> Answer | NotReady | Exception:
        ready = self._ready.pop(captcha_id, None)
        if ready is not None:
            return ready
        now = self._clock()
        count, last = self._polls.get(captcha_id, (0, float("-inf")))
        if now - last < self.dialect.poll_gap_s:
            return NOT_READY
        limit = self.dialect.polls_per_task
        if limit is not None and count >= limit:
            return errors.UnsolvableError("poll budget of the task spent", None, captcha_id)
        _remember(self._polls, captcha_id, (count + 1, now))
        try:
            data = self._call("getTaskResult", {"taskId": self._task_id(captcha_id)})
        except errors.CaptchaTasksError as exc:
            return exc
        value = parse_task_reply(self.dialect, data, captcha_id)
        if not isinstance(value, NotReady):
            self._polls.pop(captcha_id, None)
            self._methods.pop(captcha_id, None)
            cost = _cost(data)
            if cost is not None:
                self.last_cost = cost
        return value

    def _task_id(self, captcha_id: str) -> int | str:
        if self.dialect.id_type == "int" and captcha_id.isdigit():
            return int(captcha_id)
        return captcha_id

    def _call(self, endpoint: str, payload: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps({"clientKey": self._api_key, **payload})
        try:
            resp = self._http.request(
                "POST",
                f"{self.base_url}/{endpoint}",
                body=body.encode(),
                headers={"Content-Type": "application/json"},
                timeout=urllib3.Timeout(connect=self.timeout.connect, read=self.timeout.read),
                retries=False,
            )
        except urllib3.exceptions.TimeoutError:
            raise errors.TransportError(f"{endpoint}: timed out") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise errors.TransportError(f"{endpoint}: {type(exc).__name__}") from None
        if resp.status == 429:
            wait = retry_after(resp.headers.get("Retry-After"))
            raise errors.RateLimited(f"{endpoint}: HTTP 429", retry_after=wait)
        return parse_body(resp.status, resp.data.decode("utf-8", errors="replace"), endpoint)

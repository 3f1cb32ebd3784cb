"""Poll coalescing: many captchas' answers from one ``res.php?ids=`` request.

Every captcha keeps its own ``poll`` task.  When a poll task is due, the first one in a
short window (``CAPTCHAAI_BULK_WINDOW``) *leads*: it asks for every pipe-safe captcha the
account has in flight in one request per 100 ids, stores the final answers in Redis and
wakes the poll tasks of the captchas that finished, so each is delivered within
milliseconds instead of at its next scheduled poll.  The poll tasks that follow within
the window read their answer from Redis and make no request.

Where the API does not honour ``ids`` (detected from its reply and remembered for an
hour), and for answers that are not pipe-safe (image text, GeeTest objects), each poll
asks for its own id.

Every captcha is *claimed* once when its final answer is delivered (``HDEL`` of its
in-flight entry), so a woken copy and a scheduled copy of the same poll, or a redelivered
message, never deliver twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from . import errors
from .client import NOT_READY, Answer, CaptchaAIClient, _Pending
from .keys import Keys
from .limiter import ThreadLimiter
from .methods import METHODS

BULK_IDS = 100
BULK_SUPPORT_TTL = 3600
ANSWER_TTL = 600
#: Poll tasks due per bulk window (aggregate), so one of them leads soon after it opens.
LEADS_PER_WINDOW = 4

#: Called by a bulk poll with the finished captchas' lease ids and poll messages.
Finished = Callable[[list[str], list[dict[str, Any]]], None]


class AnswerBoard:
    """The Redis side of coalesced polling: in-flight captchas, answers, the lead lock."""

    def __init__(self, r: redis.Redis, keys: Keys, window_s: float) -> None:
        self.r = r
        self.keys = keys
        self.window_ms = max(1, int(window_s * 1000))

    def register(self, captcha_id: str, method: str, lease_id: str) -> None:
        value = f"{method}|{lease_id}"
        self.r.hset(self.keys.inflight_captchas(), captcha_id, value)

    def in_flight(self, captcha_id: str) -> bool:
        return bool(self.r.hexists(self.keys.inflight_captchas(), captcha_id))

    def remember_poll(self, captcha_id: str, message: dict[str, Any]) -> None:
        self.r.hset(self.keys.poll_signatures(), captcha_id, json.dumps(message))

    def claim(self, captcha_id: str) -> bool:
        """Take the right to deliver this captcha's final answer (True once only)."""
        k = self.keys
        pipe = self.r.pipeline(transaction=True)
        pipe.hdel(k.inflight_captchas(), captcha_id)
        pipe.hdel(k.poll_signatures(), captcha_id)
        pipe.hdel(k.bulk_answers(), captcha_id)
        return bool(pipe.execute()[0])

    def stored_answer(self, captcha_id: str) -> str | None:
        value = self.r.hget(self.keys.bulk_answers(), captcha_id)
        return None if value is None else str(value)

    def try_lead(self) -> bool:
        """True for the first poll in the window: it makes the bulk request."""
        return bool(self.r.set(self.keys.bulk_poll_lock(), "1", nx=True, px=self.window_ms))

    def in_flight_count(self) -> int:
        return int(self.r.hlen(self.keys.inflight_captchas()))

    def pipe_safe_in_flight(self) -> list[str]:
        entries: dict[str, str] = self.r.hgetall(self.keys.inflight_captchas())  # type: ignore[assignment]
        return [cid for cid, value in entries.items() if _pipe_safe(value.split("|")[0])]

    def lease_ids(self, captcha_ids: list[str]) -> list[str]:
        """The thread-slot lease ids of in-flight captchas."""
        if not captcha_ids:
            return []
        values = self.r.hmget(self.keys.inflight_captchas(), captcha_ids)
        return [str(v).split("|", 1)[1] for v in values if v]

    def publish(self, answers: dict[str, str]) -> list[str]:
        """Store final answers; returns the ids stored for the first time (to wake)."""
        if not answers:
            return []
        key = self.keys.bulk_answers()
        pipe = self.r.pipeline(transaction=False)
        for cid, value in answers.items():
            pipe.hsetnx(key, cid, value)
        pipe.expire(key, ANSWER_TTL)
        fresh = pipe.execute()[:-1]
        return [cid for cid, new in zip(answers, fresh, strict=True) if new]

    def poll_messages(self, captcha_ids: list[str]) -> list[dict[str, Any]]:
        if not captcha_ids:
            return []
        raw = self.r.hmget(self.keys.poll_signatures(), captcha_ids)
        return [json.loads(m) for m in raw if m]

    def bulk_supported(self) -> bool | None:
        value = self.r.get(self.keys.bulk_support())
        return None if value is None else value == "1"

    def set_bulk_supported(self, supported: bool) -> None:
        self.r.set(self.keys.bulk_support(), "1" if supported else "0", ex=BULK_SUPPORT_TTL)


def _pipe_safe(method: str) -> bool:
    spec = METHODS.get(method)
    return spec is not None and spec.pipe_safe


def encode(value: str | Exception) -> str:
    if isinstance(value, errors.CaptchaTasksError):
        return "ERR:" + value.code
    return "OK:" + str(value)


def decode(stored: str, captcha_id: str) -> str:
    """A stored final answer: the token, or the typed exception raised."""
    kind, _, rest = stored.partition(":")
    if kind == "ERR":
        raise errors.from_api_code(rest, captcha_id)
    return rest


@dataclass(frozen=True)
class Fetched:
    value: Answer | _Pending | float
    led: bool = False


class Poller:
    """Fetches one captcha's answer, coalescing with the other poll tasks when it can."""

    def __init__(
        self,
        board: AnswerBoard,
        client: CaptchaAIClient,
        limiter: ThreadLimiter,
        finished: Finished,
        bulk: bool = True,
    ) -> None:
        self.board = board
        self.client = client
        self.limiter = limiter
        self.finished = finished
        self.bulk = bulk

    def uses_bulk(self, method: str) -> bool:
        return self.bulk and _pipe_safe(method) and self.board.bulk_supported() is not False

    def next_interval(
        self, method: str, poll_interval: float, typical_s: float, led: bool = False
    ) -> float:
        """Seconds until a not-ready captcha's next poll.

        With bulk polling a poll costs no request unless it leads, and leads only once a
        window.  Polling more often than the poll interval while few captchas are in
        flight keeps a leader due in every window, so a finished captcha is seen within
        about one window; with many in flight the plain interval already does that.
        """
        if not self.uses_bulk(method):
            return poll_interval
        window = self.board.window_ms / 1000
        in_flight = max(1, self.board.in_flight_count())
        if led:
            # Leaders follow each other about once per typical solve time per captcha in
            # flight, so a bulk request per finished captcha (never more than one per
            # window): a lone captcha is not polled harder than the plain interval.
            return min(poll_interval, max(window, typical_s / in_flight))
        spread = window * in_flight / LEADS_PER_WINDOW
        return min(poll_interval, max(window, spread))

    def fetch(self, captcha_id: str, method: str) -> Fetched:
        """The answer, :data:`NOT_READY`, or seconds to wait for the request budget; and
        whether this call led a bulk request."""
        if not self.uses_bulk(method):
            return Fetched(self._single(captcha_id))
        stored = self.board.stored_answer(captcha_id)
        if stored is not None:
            return Fetched(decode(stored, captcha_id))
        if not self.board.try_lead():
            return Fetched(NOT_READY)  # a bulk request in this window found it unfinished
        return Fetched(self._lead(captcha_id), led=True)

    def _single(self, captcha_id: str) -> Answer | _Pending | float:
        wait = self.limiter.poll_wait()
        if wait > 0:
            return wait
        return self.client.get(captcha_id)

    def _lead(self, captcha_id: str) -> Answer | _Pending | float:
        ids = list(dict.fromkeys([captcha_id, *self.board.pipe_safe_in_flight()]))
        chunks = [ids[i : i + BULK_IDS] for i in range(0, len(ids), BULK_IDS)]
        wait = self.limiter.poll_wait(len(chunks))
        if wait > 0:
            return wait
        finals: dict[str, str] = {}
        for chunk in chunks:
            replies = self._ask(chunk)
            if replies is None:
                self.board.set_bulk_supported(False)
                return self.client.get(captcha_id)
            finals.update(_finals(replies))
        fresh = [c for c in self.board.publish(finals) if c != captcha_id]
        # The provider's threads are free already: give the slots back now, then wake the
        # polls that deliver the answers.
        self.finished(self.board.lease_ids(fresh), self.board.poll_messages(fresh))
        own = finals.get(captcha_id)
        return NOT_READY if own is None else decode(own, captcha_id)

    def _ask(self, chunk: list[str]) -> dict[str, str | _Pending | Exception] | None:
        if len(chunk) > 1:
            replies = self.client.get_many(chunk)
            if replies is not None:
                self.board.set_bulk_supported(True)
            return replies
        try:
            return {chunk[0]: _as_text(self.client.get(chunk[0]))}
        except errors.FatalError as exc:
            return {chunk[0]: exc}
        except errors.ResubmitError as exc:
            return {chunk[0]: exc}


def _as_text(value: Answer | _Pending) -> str | _Pending:
    return value if value is NOT_READY or isinstance(value, str) else json.dumps(value)


def _finals(replies: dict[str, str | _Pending | Exception]) -> dict[str, str]:
    return {cid: encode(v) for cid, v in replies.items() if v is not NOT_READY}

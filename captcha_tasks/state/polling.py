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
import time
from collections.abc import Callable
from typing import Any

import redis

from .. import errors
from ..client import NOT_READY, Answer, CaptchaAIClient, _Pending
from ..keys import Keys
from ..methods import METHODS
from .limiter import ThreadLimiter

BULK_IDS = 100
BULK_SUPPORT_TTL = 3600
ANSWER_TTL = 600
#: Poll tasks due per bulk window (aggregate), so one of them leads soon after it opens.
LEADS_PER_WINDOW = 4
#: Bulk requests per finished captcha the baton aims at: how soon a finished captcha is
#: seen, traded against res.php requests (2captcha allows 20 per captcha).
BULK_PER_CAPTCHA = 1.25

#: Called by a bulk poll with the finished captchas' lease ids and poll messages.
Finished = Callable[[list[str], list[dict[str, Any]]], None]
#: Publishes a poll message as the next bulk leader, after this many seconds.
Baton = Callable[[dict[str, Any], float], None]


class AnswerBoard:
    """The Redis side of coalesced polling: in-flight captchas, answers, the lead lock."""

    def __init__(self, r: redis.Redis, keys: Keys, window_s: float) -> None:
        self.r = r
        self.keys = keys
        self.window_ms = max(1, int(window_s * 1000))

    def register(self, captcha_id: str, method: str, lease_id: str, first_poll: float) -> None:
        """A captcha at the provider: its method, thread lease and first-poll time."""
        value = f"{method}|{lease_id}|{first_poll:.3f}"
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

    def pipe_safe_in_flight(self) -> dict[str, float]:
        """Pipe-safe captchas in flight, with the time each is first worth polling."""
        entries: dict[str, str] = self.r.hgetall(self.keys.inflight_captchas())  # type: ignore[assignment]
        found = {}
        for cid, value in entries.items():
            method, _lease, first_poll = value.split("|")
            if _pipe_safe(method):
                found[cid] = float(first_poll)
        return found

    def lease_ids(self, captcha_ids: list[str]) -> list[str]:
        """The thread-slot lease ids of in-flight captchas."""
        if not captcha_ids:
            return []
        values = self.r.hmget(self.keys.inflight_captchas(), captcha_ids)
        return [str(v).split("|")[1] for v in values if v]

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


class Poller:
    """Fetches one captcha's answer, coalescing with the other poll tasks when it can.

    After each bulk request the leader passes a *baton*: one extra poll message, for a
    captcha still in flight, due about one finished captcha later (at least one window,
    at most one poll interval).  Whoever runs it leads the next bulk request, so bulk
    requests keep coming while captchas are in flight without waiting for a scheduled
    poll to fall due, at roughly one request per finished captcha.
    """

    def __init__(
        self,
        board: AnswerBoard,
        client: CaptchaAIClient,
        limiter: ThreadLimiter,
        finished: Finished,
        baton: Baton,
        *,
        poll_interval: float,
        bulk: bool = True,
    ) -> None:
        self.board = board
        self.client = client
        self.limiter = limiter
        self.finished = finished
        self.baton = baton
        self.poll_interval = poll_interval
        self.bulk = bulk

    @property
    def window_s(self) -> float:
        return self.board.window_ms / 1000

    def uses_bulk(self, method: str) -> bool:
        return self.bulk and _pipe_safe(method) and self.board.bulk_supported() is not False

    def next_interval(self, method: str) -> float:
        """Seconds until a not-ready captcha's next scheduled poll.

        With bulk polling a poll costs no request unless it leads; with few captchas in
        flight, polling more often than the poll interval keeps one due in every window.
        """
        if not self.uses_bulk(method):
            return self.poll_interval
        spread = self.window_s * self.board.in_flight_count() / LEADS_PER_WINDOW
        return min(self.poll_interval, max(self.window_s, spread))

    def fetch(self, captcha_id: str, method: str, typical_s: float) -> Answer | _Pending | float:
        """The answer, :data:`NOT_READY`, or seconds to wait for the request budget."""
        if not self.uses_bulk(method):
            return self._single(captcha_id)
        stored = self.board.stored_answer(captcha_id)
        if stored is not None:
            return decode(stored, captcha_id)
        if not self.board.try_lead():
            return NOT_READY  # a bulk request in this window found it unfinished
        return self._lead(captcha_id, typical_s)

    def lead_only(self, typical_s: float) -> None:
        """A baton whose own captcha already finished: lead for the others, if due."""
        if self.board.try_lead():
            self._lead(None, typical_s)

    def _single(self, captcha_id: str) -> Answer | _Pending | float:
        wait = self.limiter.poll_wait()
        if wait > 0:
            return wait
        return self.client.get(captcha_id)

    def _lead(self, captcha_id: str | None, typical_s: float) -> Answer | _Pending | float:
        in_flight = self.board.pipe_safe_in_flight()
        own = [captcha_id] if captcha_id else []
        ids = list(dict.fromkeys([*own, *in_flight]))
        if not ids:
            return NOT_READY
        chunks = [ids[i : i + BULK_IDS] for i in range(0, len(ids), BULK_IDS)]
        wait = self.limiter.poll_wait(len(chunks))
        if wait > 0:
            return wait
        finals: dict[str, str] = {}
        for chunk in chunks:
            replies = self._ask(chunk)
            if replies is None:
                self.board.set_bulk_supported(False)
                return self.client.get(captcha_id) if captcha_id else NOT_READY
            finals.update(_finals(replies))
        fresh = [c for c in self.board.publish(finals) if c != captcha_id]
        # The provider's threads are free already: give the slots back now, then wake the
        # polls that deliver the answers.
        self.finished(self.board.lease_ids(fresh), self.board.poll_messages(fresh))
        self._pass_baton({c: t for c, t in in_flight.items() if c not in finals}, typical_s)
        mine = finals.get(captcha_id) if captcha_id else None
        return NOT_READY if mine is None else decode(mine, str(captcha_id))

    def _pass_baton(self, unfinished: dict[str, float], typical_s: float) -> None:
        if not unfinished:
            return
        # about BULK_PER_CAPTCHA bulk requests per captcha that finishes
        per_request = typical_s / (BULK_PER_CAPTCHA * len(unfinished))
        due = min(self.poll_interval, max(self.window_s, per_request))
        nearest = min(unfinished, key=unfinished.__getitem__)
        if unfinished[nearest] > time.time() + due:
            return  # nothing is worth asking for yet: the captchas' own first polls lead
        messages = self.board.poll_messages([nearest])
        if messages:
            self.baton(messages[0], due)

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

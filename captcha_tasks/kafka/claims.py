"""Claims: one solve per Kafka task across every bridge of a group, through Redis.

A task is *claimed* by ``task_id`` before it is dispatched, with the Celery task id of its
``solve``.  A redelivered task (after a crash or a rebalance) finds the claim:

    new        nobody had it: dispatch ``solve`` with the claimed Celery id
    claimed    another bridge claimed it and may be dispatching it right now: wait
    solving    its ``solve`` runs under the claim's Celery id: wait for that result
    done       its result was published: publish the stored result again

A claim whose owner died between claiming and dispatching is taken over after
:data:`DISPATCH_GRACE_S`; a solve with no result long after its deadline, after the solve
timeout plus :data:`SOLVE_GRACE_S` — and only by a caller that has looked for that
solve's result first.  Every claim expires; a done one after ``KAFKA_RESULT_TTL``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import redis

from ..settings import Settings
from ..state.db import Db
from ..state.lua import Script, ms, text

log = logging.getLogger(__name__)

T = TypeVar("T")
ClaimState = Literal["new", "takeover", "claimed", "solving", "done"]

#: Seconds an undispatched claim is trusted (its owner dispatches within milliseconds).
DISPATCH_GRACE_S = 15.0
#: Seconds past the solve timeout a dispatched solve is trusted to report its result.
SOLVE_GRACE_S = 60.0

#: K.claim: one task's claim (hash: state, celery_id, claimed_at ms, result, dead_letter).

CLAIM = Script("kafka/claim")

DISPATCHED = Script("kafka/dispatched")

COMPLETE = Script("kafka/complete")

RELEASE = Script("kafka/release")


@dataclass(frozen=True)
class Claim:
    """What :meth:`ClaimStore.claim` found."""

    state: ClaimState
    #: The Celery id to dispatch with (new, takeover) or to wait for (claimed, solving).
    celery_id: str = ""
    #: Seconds before a claimed / solving claim may be taken over.
    trust_s: float = 0.0
    #: The stored result and dead letter (JSON), when done.
    result: str = ""
    dead_letter: str = ""

    @property
    def ours(self) -> bool:
        return self.state in ("new", "takeover")


@dataclass(frozen=True)
class Answer:
    """What :meth:`ClaimStore.complete` kept for a task (JSON texts)."""

    stored: bool
    result: str
    dead_letter: str


class ClaimStore:
    """The claims of one bridge group, for one Redis client."""

    def __init__(
        self,
        db: Db,
        group: str,
        *,
        result_ttl: float,
        solve_grace_s: float,
        dispatch_grace_s: float = DISPATCH_GRACE_S,
    ) -> None:
        self.db = db
        self.r = db.redis
        self.keys = db.keys
        self.group = group
        self.result_ttl = result_ttl
        self.solve_grace_s = solve_grace_s
        self.dispatch_grace_s = dispatch_grace_s
        self._claim = db.bind(CLAIM)
        self._dispatched = db.bind(DISPATCHED)
        self._complete = db.bind(COMPLETE)
        self._release = db.bind(RELEASE)

    @classmethod
    def for_settings(cls, db: Db, settings: Settings) -> ClaimStore:
        """The claims of ``KAFKA_GROUP_ID``; a solve is trusted for its timeout plus
        :data:`SOLVE_GRACE_S`."""
        return cls(
            db,
            settings.kafka.group_id,
            result_ttl=settings.kafka.result_ttl,
            solve_grace_s=settings.solving.solve_timeout + SOLVE_GRACE_S,
        )

    @property
    def _open_ttl_ms(self) -> int:
        # Outlives every grace, so a claim is never forgotten while it is still trusted.
        return ms(2 * (self.solve_grace_s + self.dispatch_grace_s))

    def _key(self, task_id: str) -> dict[str, str]:
        return {"claim": self.keys.kafka_claim(self.group, task_id)}

    def claim(self, task_id: str, celery_id: str, *, give_up_on: str = "") -> Claim:
        """Claim ``task_id`` with ``celery_id``, or report its current claim.

        ``give_up_on`` is the Celery id whose result the caller looked for in vain: that
        claim is taken over once its grace has passed.
        """
        args: dict[str, object] = {
            "celery_id": celery_id,
            "ttl_ms": self._open_ttl_ms,
            "grace_ms": ms(self.dispatch_grace_s),
            "solving_grace_ms": ms(self.solve_grace_s),
        }
        if give_up_on:
            args["give_up_on"] = give_up_on
        reply = self._guard(lambda: self._claim(self._key(task_id), args))
        state, first, second = (text(x) for x in reply)
        if state == "done":
            return Claim("done", result=first, dead_letter=second)
        if state not in ("new", "takeover", "claimed", "solving"):
            raise RuntimeError(f"unexpected claim state {state!r}")
        trust_s = int(second) / 1000
        return Claim(cast(ClaimState, state), first, trust_s=trust_s)

    def dispatched(self, task_id: str, celery_id: str) -> bool:
        """Record that ``celery_id``'s solve was published."""
        args = {"celery_id": celery_id, "ttl_ms": self._open_ttl_ms}
        return bool(self._guard(lambda: self._dispatched(self._key(task_id), args)))

    def complete(self, task_id: str, result: str, dead_letter: str = "") -> Answer:
        """Keep the answer for ``task_id`` for ``KAFKA_RESULT_TTL``; returns the answer to
        publish: this one, or the one another bridge stored first."""
        args = {"result": result, "dead_letter": dead_letter, "ttl_ms": ms(self.result_ttl)}
        stored, kept, letter = self._guard(lambda: self._complete(self._key(task_id), args))
        return Answer(bool(int(stored)), text(kept), text(letter))

    def release(self, task_id: str, celery_id: str) -> bool:
        """Drop ``celery_id``'s undispatched claim (its dispatch failed)."""
        args = {"celery_id": celery_id}
        return bool(self._guard(lambda: self._release(self._key(task_id), args)))

    def published(self, task_id: str) -> str | None:
        """The result (JSON) published for ``task_id``, while it is kept (None: none, or
        not yet)."""
        key = self.keys.kafka_claim(self.group, task_id)
        state, result = self._guard(lambda: self.r.hmget(key, "state", "result"))
        return text(result) if text(state or b"") == "done" and result else None

    def feedback_recorded(self, provider: str, captcha_id: str) -> bool:
        """Whether a feedback message on this captcha was recorded already."""
        key = self.keys.kafka_feedback(self.group, provider, captcha_id)
        return bool(self._guard(lambda: self.r.exists(key)))

    def record_feedback(self, provider: str, captcha_id: str) -> None:
        """Note that a feedback message on this captcha was recorded (for
        ``KAFKA_RESULT_TTL``: a redelivered copy is then skipped)."""
        key = self.keys.kafka_feedback(self.group, provider, captcha_id)
        self._guard(lambda: self.r.set(key, 1, px=ms(self.result_ttl)))

    def count(self, event: str, n: int = 1) -> None:
        """Add to one of the group's counters (metrics must never stop the bridge)."""
        try:
            self.r.hincrby(self.keys.kafka_stats(self.group), event, n)
        except redis.RedisError:
            log.debug("could not count %s", event, exc_info=True)

    def stats(self) -> dict[str, int]:
        """The group's counters."""
        key = self.keys.kafka_stats(self.group)
        raw = cast(dict[Any, Any], self._guard(lambda: self.r.hgetall(key)))
        return {text(k): int(v) for k, v in raw.items()}

    def _guard(self, call: Callable[[], T]) -> T:
        return self.db.guard(call)

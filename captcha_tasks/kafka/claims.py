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

from ..connections import UNREACHABLE
from ..keys import Keys
from ..settings import Settings
from ..state.lua import unavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
Arg = str | int | float
State = Literal["new", "takeover", "claimed", "solving", "done"]

#: Seconds an undispatched claim is trusted (its owner dispatches within milliseconds).
DISPATCH_GRACE_S = 15.0
#: Seconds past the solve timeout a dispatched solve is trusted to report its result.
SOLVE_GRACE_S = 60.0

_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

CLAIM_LUA = (
    """
-- Claim a task for a solve, or say who has it.
-- KEYS[1] = the task's claim (hash: state, celery_id, claimed_at ms, result, dead_letter)
-- ARGV[1] = Celery task id to claim it with
-- ARGV[2] = TTL of a claim that is not done, ms
-- ARGV[3] = Celery id the caller gave up waiting for ('' if none): taken over only if it
--           is still the claim's and its grace has passed
-- ARGV[4] = grace of an undispatched claim, ms; ARGV[5] = grace of a dispatched one, ms
-- returns {'new' | 'takeover', ARGV[1], 0}, {'done', result, dead letter or ''},
--         or {'claimed' | 'solving', the claim's Celery id, ms until it may be taken over}
"""
    + _NOW_MS
    + """
local claim = redis.call('HMGET', KEYS[1], 'state', 'celery_id', 'claimed_at', 'result',
                         'dead_letter')
local state = claim[1]
if state == 'done' then return {'done', claim[4], claim[5] or ''} end
local status = 'new'
if state then
  local grace = tonumber(ARGV[4])
  if state == 'solving' then grace = tonumber(ARGV[5]) end
  local left = tonumber(claim[3]) + grace - now
  if claim[2] ~= ARGV[3] or left > 0 then
    return {state, claim[2], math.max(0, left)}
  end
  status = 'takeover'
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'state', 'claimed', 'celery_id', ARGV[1], 'claimed_at', now)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {status, ARGV[1], 0}
"""
)

DISPATCHED_LUA = """
-- The claim's solve was published: waiters now wait for its result.
-- KEYS[1] = the task's claim; ARGV[1] = Celery task id; ARGV[2] = TTL, ms
-- returns 1, or 0 when the claim is no longer this Celery id's
if redis.call('HGET', KEYS[1], 'celery_id') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'state') ~= 'claimed' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'solving')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

COMPLETE_LUA = """
-- Store the answer published for a task; the first answer stored is the one kept.
-- KEYS[1] = the task's claim; ARGV[1] = result JSON; ARGV[2] = dead letter JSON or ''
-- ARGV[3] = TTL, ms
-- returns {1, result, dead letter} when stored, {0, the kept result, its dead letter}
-- when another answer was stored first
if redis.call('HGET', KEYS[1], 'state') == 'done' then
  local kept = redis.call('HMGET', KEYS[1], 'result', 'dead_letter')
  return {0, kept[1], kept[2] or ''}
end
redis.call('HSET', KEYS[1], 'state', 'done', 'result', ARGV[1], 'dead_letter', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, ARGV[1], ARGV[2]}
"""

RELEASE_LUA = """
-- Drop a claim whose dispatch failed, so a redelivery dispatches at once.
-- KEYS[1] = the task's claim; ARGV[1] = Celery task id
-- returns 1 when dropped, 0 when the claim is no longer this Celery id's undispatched one
if redis.call('HGET', KEYS[1], 'celery_id') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'state') ~= 'claimed' then return 0 end
return redis.call('DEL', KEYS[1])
"""


@dataclass(frozen=True)
class Claim:
    """What :meth:`ClaimStore.claim` found."""

    state: State
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
        r: redis.Redis,
        keys: Keys,
        group: str,
        *,
        result_ttl: float,
        solve_grace_s: float,
        dispatch_grace_s: float = DISPATCH_GRACE_S,
    ) -> None:
        self.r = r
        self.keys = keys
        self.group = group
        self.result_ttl = result_ttl
        self.solve_grace_s = solve_grace_s
        self.dispatch_grace_s = dispatch_grace_s
        self._claim = r.register_script(CLAIM_LUA)
        self._dispatched = r.register_script(DISPATCHED_LUA)
        self._complete = r.register_script(COMPLETE_LUA)
        self._release = r.register_script(RELEASE_LUA)

    @classmethod
    def for_settings(cls, r: redis.Redis, keys: Keys, settings: Settings) -> ClaimStore:
        """The claims of ``KAFKA_GROUP_ID``; a solve is trusted for its timeout plus
        :data:`SOLVE_GRACE_S`."""
        return cls(
            r,
            keys,
            settings.kafka_group_id,
            result_ttl=settings.kafka_result_ttl,
            solve_grace_s=settings.solve_timeout + SOLVE_GRACE_S,
        )

    @property
    def _open_ttl_ms(self) -> int:
        # Outlives every grace, so a claim is never forgotten while it is still trusted.
        return _ms(2 * (self.solve_grace_s + self.dispatch_grace_s))

    def _key(self, task_id: str) -> str:
        return self.keys.kafka_claim(self.group, task_id)

    def claim(self, task_id: str, celery_id: str, *, give_up_on: str = "") -> Claim:
        """Claim ``task_id`` with ``celery_id``, or report its current claim.

        ``give_up_on`` is the Celery id whose result the caller looked for in vain: that
        claim is taken over once its grace has passed.
        """
        args: list[Arg] = [
            celery_id,
            self._open_ttl_ms,
            give_up_on,
            _ms(self.dispatch_grace_s),
            _ms(self.solve_grace_s),
        ]
        reply = _guard(lambda: self._claim(keys=[self._key(task_id)], args=args))
        state, first, second = (_text(x) for x in reply)
        if state == "done":
            return Claim("done", result=first, dead_letter=second)
        if state not in ("new", "takeover", "claimed", "solving"):
            raise RuntimeError(f"unexpected claim state {state!r}")
        trust_s = int(second) / 1000
        return Claim(cast(State, state), first, trust_s=trust_s)

    def dispatched(self, task_id: str, celery_id: str) -> bool:
        """Record that ``celery_id``'s solve was published."""
        args: list[Arg] = [celery_id, self._open_ttl_ms]
        return bool(_guard(lambda: self._dispatched(keys=[self._key(task_id)], args=args)))

    def complete(self, task_id: str, result: str, dead_letter: str = "") -> Answer:
        """Keep the answer for ``task_id`` for ``KAFKA_RESULT_TTL``; returns the answer to
        publish: this one, or the one another bridge stored first."""
        args: list[Arg] = [result, dead_letter, _ms(self.result_ttl)]
        stored, kept, letter = _guard(lambda: self._complete(keys=[self._key(task_id)], args=args))
        return Answer(bool(int(stored)), _text(kept), _text(letter))

    def release(self, task_id: str, celery_id: str) -> bool:
        """Drop ``celery_id``'s undispatched claim (its dispatch failed)."""
        return bool(_guard(lambda: self._release(keys=[self._key(task_id)], args=[celery_id])))

    def count(self, event: str, n: int = 1) -> None:
        """Add to one of the group's counters (metrics must never stop the bridge)."""
        try:
            self.r.hincrby(self.keys.kafka_stats(self.group), event, n)
        except redis.RedisError:
            log.debug("could not count %s", event, exc_info=True)

    def stats(self) -> dict[str, int]:
        """The group's counters."""
        key = self.keys.kafka_stats(self.group)
        raw = cast(dict[Any, Any], _guard(lambda: self.r.hgetall(key)))
        return {_text(k): int(v) for k, v in raw.items()}


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _guard(call: Callable[[], T]) -> T:
    try:
        return call()
    except UNREACHABLE as exc:
        raise unavailable(exc) from None

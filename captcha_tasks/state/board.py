"""The board: every captcha at the provider, when to poll it next, and how each solve ends.

A submitted captcha is *registered* with its job and its first poll time.  Polls run in
*rounds*: a round takes every captcha that is due (one ``res.php?ids=`` request answers up
to 100 of them), and puts the unfinished ones back with their next poll time.  One round
message is pending at a time (``poll_round`` holds when it is due); registering a captcha
due sooner schedules an earlier one.  A round marks the captchas it took as not due for a
while, so a round that dies with its worker loses nothing: they come due again.

Every solve ends in :meth:`Board.finish`, one script that claims the solve exactly once
(a poll, a bulk poll, a provider callback or a pool hit: whichever comes first), frees its
thread and hands it to the next parked submit, stores the outcome under the caller's
result key and appends it to the solve's batch stream.  A captcha that failed but whose
solve goes on (unsolvable, expired) is *retired*: it leaves the board and the solve, still
holding its slot, is owed a submit message like a handed-out parked submit.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis

from ..keys import Keys
from .limiter import HANDOUT_FN, Handout, ThreadLimiter, handed
from .lua import guard, lua, ms, script, text

T = TypeVar("T")
Arg = str | int | float

BULK_SUPPORT_TTL = 3600
BATCH_STREAM_TTL = 24 * 3600
#: Solve-time samples kept per method.
SAMPLE_WINDOW = 200

#: Lua: make sure a round message is due by ``at`` (ms); returns {countdown ms, at} of a
#: round message to publish, or {-1} when one is pending in time.
SCHEDULE_FN = """
local function schedule(round, at, gap_ms, grace_ms)
  if at < now then at = now end
  local pending = tonumber(redis.call('GET', round) or '')
  if pending and pending <= at + gap_ms then return {-1} end
  redis.call('SET', round, at, 'PX', at - now + grace_ms)
  return {at - now, at}
end
"""

REGISTER_LUA = lua(
    """
-- A captcha is at the provider: put it on the board and schedule its first poll.
-- KEYS[1] = board (hash: captcha id -> job JSON), KEYS[2] = due (zset: captcha id -> ms)
-- KEYS[3] = slots, KEYS[4] = the solve's record (hash), KEYS[5] = its submit claim
-- KEYS[6] = the pending round (string: ms)
-- ARGV[1] = captcha id, ARGV[2] = job JSON, ARGV[3] = lease id, ARGV[4] = lease ms
-- ARGV[5] = attempt, ARGV[6] = record ttl s, ARGV[7] = ms until the first poll
-- ARGV[8] = least ms between rounds, ARGV[9] = ms a round message may be late
-- returns {countdown ms, due ms} of a round message the caller must publish, or {-1}
""",
    SCHEDULE_FN,
    """
local cid = ARGV[1]
local due = now + tonumber(ARGV[7])
redis.call('HSET', KEYS[1], cid, ARGV[2])
redis.call('ZADD', KEYS[2], due, cid)
redis.call('ZADD', KEYS[3], 'XX', now + tonumber(ARGV[4]), ARGV[3])
redis.call('HSET', KEYS[4], 'attempt', ARGV[5], 'captcha_id', cid)
redis.call('EXPIRE', KEYS[4], tonumber(ARGV[6]))
redis.call('DEL', KEYS[5])
return schedule(KEYS[6], due, tonumber(ARGV[8]), tonumber(ARGV[9]))
""",
)

POP_DUE_LUA = lua(
    """
-- Start a poll round: take the captchas that are due.
-- KEYS[1] = due, KEYS[2] = board, KEYS[3] = poll state (hash: id -> "<polled ms>|<errors>")
-- KEYS[4] = the pending round
-- ARGV[1] = this round's due time ('' for an extra round), ARGV[2] = most captchas
-- ARGV[3] = ms the taken captchas stay out of other rounds (longer than a round lasts)
-- returns {id, job, state, id, job, state, ...}
""",
    """
if ARGV[1] ~= '' and tonumber(redis.call('GET', KEYS[4]) or '') == tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[4])
end
local out = {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  local job = redis.call('HGET', KEYS[2], id)
  if job then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), id)
    table.insert(out, id)
    table.insert(out, job)
    table.insert(out, redis.call('HGET', KEYS[3], id) or '')
  else
    redis.call('ZREM', KEYS[1], id)
  end
end
return out
""",
)

END_ROUND_LUA = lua(
    """
-- End a poll round: put the unfinished captchas back, and schedule the next round.
-- KEYS[1] = due, KEYS[2] = poll state, KEYS[3] = slots, KEYS[4] = the pending round
-- KEYS[5] = board
-- ARGV[1] = lease ms, ARGV[2] = least ms until the next round, ARGV[3] = round grace ms
-- ARGV[4] = when they were polled (ms, the polling host's clock)
-- ARGV[5..] = captcha id, lease id, ms until its next poll, transport errors (repeated)
-- returns {countdown ms, due ms} of a round message the caller must publish, or {-1}
""",
    SCHEDULE_FN,
    """
local lease_ms = tonumber(ARGV[1])
for i = 5, #ARGV, 4 do
  local id = ARGV[i]
  if redis.call('HEXISTS', KEYS[5], id) == 1 then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[i + 2]), id)
    redis.call('HSET', KEYS[2], id, ARGV[4] .. '|' .. ARGV[i + 3])
    redis.call('ZADD', KEYS[3], 'XX', now + lease_ms, ARGV[i + 1])
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if not first[1] then return {-1} end
local gap = tonumber(ARGV[2])
return schedule(KEYS[4], math.max(tonumber(first[2]), now + gap), gap, tonumber(ARGV[3]))
""",
)

ENSURE_ROUND_LUA = lua(
    """
-- Make sure a round message is pending while captchas are on the board.
-- KEYS[1] = due, KEYS[2] = the pending round
-- ARGV[1] = least ms between rounds, ARGV[2] = round grace ms
-- returns {countdown ms, due ms} of a round message the caller must publish, or {-1}
""",
    SCHEDULE_FN,
    """
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if not first[1] then return {-1} end
return schedule(KEYS[2], tonumber(first[2]), tonumber(ARGV[1]), tonumber(ARGV[2]))
""",
)

RETIRE_LUA = lua(
    """
-- A captcha failed but its solve goes on with a new one: take it off the board; the solve
-- keeps its slot and is owed a submit message for its next attempt.
-- KEYS[1] = board, KEYS[2] = due, KEYS[3] = poll state, KEYS[4] = slots
-- KEYS[5] = waiting (hash), KEYS[6] = dispatch (zset), KEYS[7] = API errors by code (hash)
-- ARGV[1] = captcha id, ARGV[2] = lease id, ARGV[3] = the next attempt's job (JSON)
-- ARGV[4] = ms until the solve's deadline, ARGV[5] = lease ms, ARGV[6] = grace ms
-- ARGV[7] = the error code to count
-- returns 1 when retired, 0 when the captcha was no longer on the board
""",
    """
local cid, lease = ARGV[1], ARGV[2]
if redis.call('HDEL', KEYS[1], cid) == 0 then return 0 end
redis.call('ZREM', KEYS[2], cid)
redis.call('HDEL', KEYS[3], cid)
redis.call('ZADD', KEYS[4], 'XX', now + tonumber(ARGV[5]), lease)
redis.call('HSET', KEYS[5], lease, tostring(now + tonumber(ARGV[4])) .. '|' .. ARGV[3])
redis.call('ZADD', KEYS[6], now + tonumber(ARGV[6]), lease)
redis.call('HINCRBY', KEYS[7], ARGV[7], 1)
return 1
""",
)

FINISH_LUA = lua(
    """
-- The one completion of a solve: claim it once, free its thread (handing it to the next
-- parked submit), store its outcome for the caller and append it to its batch stream.
-- KEYS[1] = board, KEYS[2] = due, KEYS[3] = poll state
-- KEYS[4] = slots, KEYS[5] = parked, KEYS[6] = waiting, KEYS[7] = dispatch
-- KEYS[8] = the solve's record (hash), KEYS[9] = its submit claim, KEYS[10] = its secrets
-- KEYS[11] = its result key, KEYS[12] = its batch stream, KEYS[13] = the batch's cancelled flag
-- KEYS[14] = the method's solve times (list), KEYS[15] = solves by source (hash)
-- KEYS[16] = API errors by code (hash)
-- KEYS[17] = requested (zset), KEYS[18] = requested messages (hash): its message ran
-- ARGV[1] = captcha id ('' when no captcha of the solve is at the provider)
-- ARGV[2] = lease id, ARGV[3..8] = handout: lease ms, capacity, refill capacity, most
--   handed out, refill band, grace ms
-- ARGV[9] = record ttl s, ARGV[10] = result value ('' stores none), ARGV[11] = result ttl s
-- ARGV[12] = batch entry ('' none), ARGV[13] = batch stream ttl s
-- ARGV[14] = solve time s ('' none), ARGV[15] = samples kept
-- ARGV[16] = source to count ('' none), ARGV[17] = error code to count ('' none)
-- returns {0} when the solve was completed already (nothing stored or emitted), else
--   {1, given, expired}: the handed-out submits, as from RELEASE
""",
    HANDOUT_FN,
    """
local cid = ARGV[1]
if cid ~= '' then
  if redis.call('HDEL', KEYS[1], cid) == 0 then return {0} end
  redis.call('ZREM', KEYS[2], cid)
  redis.call('HDEL', KEYS[3], cid)
end
if redis.call('HSETNX', KEYS[8], 'done', '1') == 0 then return {0} end
redis.call('EXPIRE', KEYS[8], tonumber(ARGV[9]))
redis.call('ZREM', KEYS[17], ARGV[2])
redis.call('HDEL', KEYS[18], ARGV[2])
redis.call('DEL', KEYS[9], KEYS[10])
local lease = ARGV[2]
redis.call('ZREM', KEYS[4], lease)
redis.call('ZREM', KEYS[5], lease)
redis.call('HDEL', KEYS[6], lease)
redis.call('ZREM', KEYS[7], lease)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local out = handout(KEYS[4], KEYS[5], KEYS[6], KEYS[7], tonumber(ARGV[3]), tonumber(ARGV[4]),
                    tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]))
if ARGV[10] ~= '' then
  redis.call('SET', KEYS[11], ARGV[10], 'EX', tonumber(ARGV[11]))
  redis.call('PUBLISH', KEYS[11], ARGV[10])
end
if ARGV[12] ~= '' and redis.call('EXISTS', KEYS[13]) == 0 then
  redis.call('XADD', KEYS[12], '*', 'outcome', ARGV[12])
  redis.call('EXPIRE', KEYS[12], tonumber(ARGV[13]))
end
if ARGV[14] ~= '' then
  redis.call('LPUSH', KEYS[14], ARGV[14])
  redis.call('LTRIM', KEYS[14], 0, tonumber(ARGV[15]) - 1)
end
if ARGV[16] ~= '' then redis.call('HINCRBY', KEYS[15], ARGV[16], 1) end
if ARGV[17] ~= '' then redis.call('HINCRBY', KEYS[16], ARGV[17], 1) end
return {1, out[1], out[2]}
""",
)


@dataclass(frozen=True)
class Entry:
    """A captcha on the board, as a round takes it."""

    captcha_id: str
    job: dict[str, Any]
    #: When it was last polled and was not ready (s, the polling host's clock); None before
    #: its first poll.
    polled_at: float | None
    #: Transport errors while polling it so far.
    errors: int


@dataclass(frozen=True)
class RoundDue:
    """A poll round message to publish: after ``countdown_s``, carrying ``at_ms``."""

    countdown_s: float
    at_ms: int


@dataclass(frozen=True)
class Again:
    """A captcha a round puts back: poll it again after ``delay_s``."""

    captcha_id: str
    lease_id: str
    delay_s: float
    errors: int = 0


@dataclass(frozen=True)
class Completion:
    """Everything :meth:`Board.finish` stores for one solve; built by the worker.

    ``result_key`` / ``result_value`` are opaque here: the caller's result record (the
    worker encodes Celery's).  ``batch_entry`` is the JSON line of its batch stream.
    """

    solve_id: str
    method: str
    captcha_id: str | None = None
    result_key: str | None = None
    result_value: str | None = None
    result_ttl_s: int = 3600
    batch_id: str | None = None
    batch_entry: str | None = None
    solve_time_s: float | None = None
    source: str | None = None
    error_code: str | None = None


@dataclass(frozen=True)
class Finished:
    """What :meth:`Board.finish` did: ``claimed`` False when the solve had ended already."""

    claimed: bool
    handout: Handout = field(default_factory=lambda: Handout([], []))


@dataclass(frozen=True)
class BoardConfig:
    #: Least seconds between poll rounds (the bulk window).
    round_gap_s: float
    #: Seconds a round may run before its captchas are due again (> the HTTP timeouts).
    round_hold_s: float
    #: Seconds a record of a finished solve is kept, to recognise duplicate messages.
    record_ttl_s: int
    #: Seconds a round message may be late before another one is scheduled.
    round_grace_s: float = 5.0


class Board:
    """The captchas at the provider, their poll schedule and every solve's completion."""

    def __init__(
        self, r: redis.Redis, keys: Keys, limiter: ThreadLimiter, config: BoardConfig
    ) -> None:
        self.r = r
        self.keys = keys
        self.limiter = limiter
        self.config = config
        self._register = script(r, REGISTER_LUA)
        self._pop = script(r, POP_DUE_LUA)
        self._end_round = script(r, END_ROUND_LUA)
        self._ensure = script(r, ENSURE_ROUND_LUA)
        self._retire = script(r, RETIRE_LUA)
        self._finish = script(r, FINISH_LUA)

    # -- submit ------------------------------------------------------------------------
    def register(self, job: Mapping[str, Any], first_poll_in_s: float) -> RoundDue | None:
        """Put a submitted captcha on the board; returns the round message to publish, or
        None when one is due in time already."""
        k, cfg = self.keys, self.config
        solve_id, captcha_id = str(job["solve_id"]), str(job["captcha_id"])
        keys = [
            k.board(),
            k.poll_due(),
            k.slots(),
            k.submission(solve_id),
            k.submit_claim(solve_id),
            k.poll_round(),
        ]
        args: list[Arg] = [
            captcha_id,
            _dumps(job),
            solve_id,
            # the lease outlives the wait to its first poll (long with callbacks on)
            ms(self.limiter.config.lease_s + max(0.0, first_poll_in_s)),
            int(job.get("attempt", 0)),
            cfg.record_ttl_s,
            ms(max(0.0, first_poll_in_s)),
            ms(cfg.round_gap_s),
            ms(cfg.round_grace_s),
        ]
        return _countdown(_guarded(lambda: self._register(keys=keys, args=args)))

    # -- poll rounds -------------------------------------------------------------------
    def take_due(self, round_at_ms: int | None, most: int) -> list[Entry]:
        """Start a round: the captchas due now (kept out of other rounds for a while)."""
        k = self.keys
        keys = [k.poll_due(), k.board(), k.poll_state(), k.poll_round()]
        args: list[Arg] = ["" if round_at_ms is None else round_at_ms, most]
        args.append(ms(self.config.round_hold_s))
        reply = _guarded(lambda: self._pop(keys=keys, args=args))
        return [_entry(*reply[i : i + 3]) for i in range(0, len(reply), 3)]

    def end_round(self, polled_at: float, again: Sequence[Again], gap_s: float) -> RoundDue | None:
        """Put unfinished captchas back; returns the next round message to publish, or
        None when one is pending in time (or nothing is left on the board)."""
        k = self.keys
        keys = [k.poll_due(), k.poll_state(), k.slots(), k.poll_round(), k.board()]
        args: list[Arg] = [
            ms(self.limiter.config.lease_s),
            ms(gap_s),
            ms(self.config.round_grace_s),
            ms(polled_at),
        ]
        for a in again:
            args += [a.captcha_id, a.lease_id, ms(max(0.0, a.delay_s)), a.errors]
        return _countdown(_guarded(lambda: self._end_round(keys=keys, args=args)))

    def ensure_round(self) -> RoundDue | None:
        """A round message to publish when captchas are on the board and none is pending
        (its message was lost), else None."""
        keys = [self.keys.poll_due(), self.keys.poll_round()]
        args: list[Arg] = [ms(self.config.round_gap_s), ms(self.config.round_grace_s)]
        return _countdown(_guarded(lambda: self._ensure(keys=keys, args=args)))

    def retire(
        self, captcha_id: str, next_job: Mapping[str, Any], deadline_in_s: float, code: str
    ) -> bool:
        """Take a failed captcha off the board; its solve keeps its slot and is owed a
        submit message for ``next_job``.  False when it was not on the board any more."""
        k = self.keys
        keys = [
            k.board(),
            k.poll_due(),
            k.poll_state(),
            k.slots(),
            k.waiting(),
            k.dispatch(),
            k.api_errors(),
        ]
        args: list[Arg] = [
            captcha_id,
            str(next_job["solve_id"]),
            _dumps(next_job),
            ms(max(0.0, deadline_in_s)),
            ms(self.limiter.config.lease_s),
            self.limiter.handout_args()[-1],
            code,
        ]
        return bool(_guarded(lambda: self._retire(keys=keys, args=args)))

    # -- the one completion path -------------------------------------------------------
    def finish(self, done: Completion, client: Any = None) -> Finished:
        """Complete a solve (see ``FINISH_LUA``).  With ``client`` (a pipeline) the call is
        queued and its reply is read with :func:`finished` after ``execute()``."""
        keys, args = self._finish_call(done)
        if client is not None:
            self._finish(keys=keys, args=args, client=client)
            return Finished(False)
        return finished(_guarded(lambda: self._finish(keys=keys, args=args)))

    def _finish_call(self, done: Completion) -> tuple[list[str], list[Arg]]:
        k = self.keys
        keys = [
            k.board(),
            k.poll_due(),
            k.poll_state(),
            *self.limiter.slot_keys(),
            k.submission(done.solve_id),
            k.submit_claim(done.solve_id),
            k.request_secrets(done.solve_id),
            done.result_key or k.submission(done.solve_id),
            k.batch_results(done.batch_id or "-"),
            k.batch_cancelled(done.batch_id or "-"),
            k.solve_times(done.method),
            k.solved_counter(done.method),
            k.api_errors(),
            k.requested(),
            k.requested_messages(),
        ]
        solve_time = "" if done.solve_time_s is None else f"{done.solve_time_s:.3f}"
        args: list[Arg] = [
            done.captcha_id or "",
            done.solve_id,
            *self.limiter.handout_args(),
            self.config.record_ttl_s,
            (done.result_value or "") if done.result_key else "",
            done.result_ttl_s,
            done.batch_entry or "",
            BATCH_STREAM_TTL,
            solve_time,
            SAMPLE_WINDOW,
            done.source or "",
            done.error_code or "",
        ]
        return keys, args

    def pipeline(self) -> Any:
        return self.r.pipeline(transaction=False)

    def run(self, pipe: Any) -> list[Any]:
        """Execute a pipeline of queued calls (Redis outages become StoreUnavailable)."""
        return list(_guarded(pipe.execute))

    # -- reading -----------------------------------------------------------------------
    def lookup(self, captcha_id: str, solve_id: str) -> tuple[Entry | None, bool]:
        """The captcha as a round would take it (None when it is not on the board), and
        whether ``solve_id`` has ended with this captcha (a callback for it is a replay)."""
        k = self.keys
        pipe = self.r.pipeline(transaction=False)
        pipe.hget(k.board(), captcha_id)
        pipe.hget(k.poll_state(), captcha_id)
        pipe.hmget(k.submission(solve_id), "captcha_id", "done")
        job, state, (last, done) = _guarded(pipe.execute)
        entry = None if job is None else _entry(captcha_id, job, state or "")
        ended = done is not None and last is not None and text(last) == captcha_id
        return entry, ended

    def in_flight_count(self) -> int:
        return int(_guarded(lambda: self.r.hlen(self.keys.board())))

    def in_flight(self, captcha_id: str) -> bool:
        return bool(_guarded(lambda: self.r.hexists(self.keys.board(), captcha_id)))

    def count_errors(self, codes: Sequence[str]) -> None:
        """Count API error answers that did not end a solve (retried, resubmitted)."""
        if not codes:
            return
        pipe = self.r.pipeline(transaction=False)
        for code in codes:
            pipe.hincrby(self.keys.api_errors(), code, 1)
        _guarded(pipe.execute)

    def count_callback(self, verdict: str) -> None:
        """Count one provider callback by verdict."""
        _guarded(lambda: self.r.hincrby(self.keys.pingback_callbacks(), verdict, 1))

    def callback_counts(self) -> dict[str, int]:
        """Provider callbacks so far, by verdict."""
        raw = _guarded(lambda: self.r.hgetall(self.keys.pingback_callbacks()))
        return {text(k): int(v) for k, v in raw.items()}

    def bulk_supported(self) -> bool | None:
        """Whether the API honours ``res.php?ids=`` (None: not known yet)."""
        value = _guarded(lambda: self.r.get(self.keys.bulk_support()))
        return None if value is None else text(value) == "1"

    def set_bulk_supported(self, supported: bool) -> None:
        key = self.keys.bulk_support()
        value = "1" if supported else "0"
        _guarded(lambda: self.r.set(key, value, ex=BULK_SUPPORT_TTL))


def finished(reply: Any) -> Finished:
    """A FINISH reply as a value."""
    if int(reply[0]) == 0:
        return Finished(False)
    return Finished(True, Handout(handed(reply[1]), handed(reply[2])))


def _entry(captcha_id: Any, job: Any, state: Any) -> Entry:
    polled, _, errors = text(state).partition("|")
    polled_at = int(polled) / 1000 if polled else None
    return Entry(text(captcha_id), json.loads(text(job)), polled_at, int(errors or 0))


def _countdown(reply: Any) -> RoundDue | None:
    countdown = int(reply[0])
    return None if countdown < 0 else RoundDue(countdown / 1000, int(reply[1]))


def _dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"))


def _guarded(call: Callable[[], T]) -> T:
    return guard(call, "the board is unavailable")

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
result key and appends it to the solve's batch stream.  Each of those is a Lua function of
the module that owns its keys (the limiter's slots, the solve's record, the batch stream,
the solve times, the counters); the board's scripts only put them together.  A captcha
that failed but whose solve goes on (unsolvable, expired) is *retired*: it leaves the board
and the solve, still holding its slot, is owed a submit message like a handed-out parked
submit.

Jobs are opaque JSON strings here; the worker knows what is in them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..core.admission import NO_HANDOUT, Handout
from ..core.rounds import Again, Entry, RoundDue
from .batches import BATCH, STREAM_TTL, batch_keys
from .channel import EARLY, EARLY_KEEP_S, EARLY_MOST, EARLY_POLL_S, early_keys, early_ticket
from .db import Db
from .followups import FOLLOWUPS, followup_keys
from .limiter import MESSAGES, SLOTS, ThreadLimiter, handed_out
from .lua import Lib, Script, ms, text
from .records import RECORD, record_keys
from .secrets import SECRETS, secrets_keys
from .stats import STATS, stats_keys
from .timing import TIMES, times_keys

T = TypeVar("T")

#: Lua: K.board (hash: captcha id -> job JSON), K.due (zset: captcha id -> when it is
#: polled next, ms), K.poll_state (hash: id -> "<polled ms>|<errors>"), K.round (string:
#: when the pending round message is due, ms).
BOARD = Lib(
    name="BOARD",
    keys=("board", "due", "poll_state", "round"),
    source="""
-- Make sure a round message is due by at (ms); returns {countdown ms, at} of a round
-- message to publish, or {-1} when one is pending in time.
local function board_schedule(K, at, gap_ms, grace_ms)
  if at < now then at = now end
  local pending = tonumber(redis.call('GET', K.round) or '')
  if pending and pending <= at + gap_ms then return {-1} end
  redis.call('SET', K.round, at, 'PX', at - now + grace_ms)
  return {at - now, at}
end
-- Take a captcha off the board: false when it was not on it.
local function board_take(K, cid)
  if redis.call('HDEL', K.board, cid) == 0 then return false end
  redis.call('ZREM', K.due, cid)
  redis.call('HDEL', K.poll_state, cid)
  return true
end
""",
)

REGISTER = Script(
    """
-- A captcha is at the provider: put it on the board and schedule its first poll; take
-- the callback that came for it before this (an early one).
-- K: BOARD, SLOTS (its lease), RECORD (the solve's record and claim), EARLY, K.result
--   (the caller's result key: opaque here)
-- A.cid = captcha id, A.job (JSON), A.lease = lease id, A.handout (SLOTS),
-- A.first_ms = ms until the first poll (the lease outlives it), A.attempt, A.provider,
-- A.ticket (its early callback's, EARLY), A.early_ms = ms until the first poll of a
--   captcha whose early callback is handed to the caller (should it die before applying
--   it, a poll reads the answer the provider has), A.record_ttl_s, A.gap_ms = least ms
--   between rounds, A.grace_ms = ms a round may be late,
-- A.submitted_record = what the caller's result key says while the captcha is at the
--   provider (absent: nothing), A.result_ttl_s
-- returns {{countdown ms, due ms} of a round message the caller must publish, or {-1};
--   the early callback's code, or false}
""",
    keys=("result",),
    libs=(BOARD, SLOTS, RECORD, EARLY),
    body="""
local early = early_take(K, A.ticket, A.cid)
local first_ms = A.first_ms
if early then first_ms = math.min(first_ms, A.early_ms) end
local due = now + first_ms
redis.call('HSET', K.board, A.cid, A.job)
redis.call('ZADD', K.due, due, A.cid)
slot_renew(K, A.handout, A.lease, first_ms)
local ended = redis.call('HEXISTS', K.record, 'done') == 1
record_submitted(K, A.attempt, A.cid, A.provider, A.record_ttl_s)
if A.submitted_record and not ended then
  redis.call('SET', K.result, A.submitted_record, 'EX', A.result_ttl_s)
  redis.call('PUBLISH', K.result, A.submitted_record)
end
return {board_schedule(K, due, A.gap_ms, A.grace_ms), early}
""",
)

KEEP_EARLY = Script(
    """
-- A callback for a captcha not on the board: keep it until the captcha is registered.
-- K: BOARD, RECORD (the ticket's solve), EARLY
-- A.cid = captcha id, A.attempt and A.ticket (EARLY) of the ticket, A.code,
-- A.keep_ms = how long it is kept, A.most = how many are kept at most
-- returns 'registered' (on the board now: judge it again), 'passed' (the ticket's attempt
--   is registered, as another captcha, or its solve is over), or EARLY's 'kept', 'again'
--   or 'full'
""",
    libs=(BOARD, RECORD, EARLY),
    body="""
if redis.call('HEXISTS', K.board, A.cid) == 1 then return 'registered' end
if record_passed(K, A.attempt) then return 'passed' end
return early_keep(K, A.ticket, A.cid, A.code, A.keep_ms, A.most)
""",
)

TAKE_DUE = Script(
    """
-- Start a poll round: take the captchas that are due.
-- K: BOARD
-- A.round_at = this round's due time (absent for an extra round), A.most = most captchas,
-- A.hold_ms = ms the taken captchas stay out of other rounds (longer than a round lasts)
-- returns {id, job, state, id, job, state, ...}
""",
    libs=(BOARD,),
    body="""
if A.round_at and tonumber(redis.call('GET', K.round) or '') == A.round_at then
  redis.call('DEL', K.round)
end
local out = {}
local ids = redis.call('ZRANGEBYSCORE', K.due, '-inf', now, 'LIMIT', 0, A.most)
for _, id in ipairs(ids) do
  local job = redis.call('HGET', K.board, id)
  if job then
    redis.call('ZADD', K.due, now + A.hold_ms, id)
    table.insert(out, id)
    table.insert(out, job)
    table.insert(out, redis.call('HGET', K.poll_state, id) or '')
  else
    redis.call('ZREM', K.due, id)
  end
end
return out
""",
)

END_ROUND = Script(
    """
-- End a poll round: put the unfinished captchas back (renewing their leases), and
-- schedule the next round.
-- K: BOARD, SLOTS
-- A.handout (SLOTS), A.gap_ms = least ms until the next round, A.grace_ms (round),
-- A.polled_ms = when they were polled (ms, the polling host's clock),
-- A.again = [[captcha id, lease id, ms until its next poll, transport errors], ...]
-- returns {countdown ms, due ms} of a round message the caller must publish, or {-1}
""",
    libs=(BOARD, SLOTS),
    body="""
for _, item in ipairs(A.again) do
  local id = item[1]
  if redis.call('HEXISTS', K.board, id) == 1 then
    redis.call('ZADD', K.due, now + item[3], id)
    redis.call('HSET', K.poll_state, id, A.polled_ms .. '|' .. item[4])
    slot_renew(K, A.handout, item[2], 0)
  end
end
local first = redis.call('ZRANGE', K.due, 0, 0, 'WITHSCORES')
if not first[1] then return {-1} end
return board_schedule(K, math.max(tonumber(first[2]), now + A.gap_ms), A.gap_ms, A.grace_ms)
""",
)

ENSURE_ROUND = Script(
    """
-- Make sure a round message is pending while captchas are on the board.
-- K: BOARD
-- A.gap_ms = least ms between rounds, A.grace_ms = ms a round may be late
-- returns {countdown ms, due ms} of a round message the caller must publish, or {-1}
""",
    libs=(BOARD,),
    body="""
local first = redis.call('ZRANGE', K.due, 0, 0, 'WITHSCORES')
if not first[1] then return {-1} end
return board_schedule(K, tonumber(first[2]), A.gap_ms, A.grace_ms)
""",
)

RETIRE = Script(
    """
-- A captcha failed but its solve goes on with a new one: take it off the board; the solve
-- keeps its slot and is owed a submit message for its next attempt.
-- K: BOARD, SLOTS, STATS, K.resubmits (hash: new captchas by reason)
-- A.cid = captcha id, A.lease = lease id, A.job = the next attempt's job (JSON),
-- A.deadline_ms = ms until the solve's deadline, A.handout (SLOTS), A.code = the error,
-- A.reason = why a new captcha is submitted
-- returns 1 when retired, 0 when the captcha was no longer on the board
""",
    keys=("resubmits",),
    libs=(BOARD, SLOTS, STATS),
    body="""
if not board_take(K, A.cid) then return 0 end
slot_renew(K, A.handout, A.lease, 0)
slot_owe(K, A.lease, now + A.deadline_ms, A.job, now + A.handout.grace_ms)
stats_count(K, '', A.code)
redis.call('HINCRBY', K.resubmits, A.reason, 1)
return 1
""",
)

EVACUATE = Script(
    """
-- The provider is out of rotation and its captchas will not be answered: make every one
-- due now (the round that takes them submits each elsewhere) and schedule a round.
-- K: BOARD
-- A.most = most captchas moved, A.gap_ms, A.grace_ms (rounds)
-- returns {countdown ms, due ms} of a round message the caller must publish, or {-1}
""",
    libs=(BOARD,),
    body="""
local ids = redis.call('ZRANGEBYSCORE', K.due, '(' .. now, '+inf', 'LIMIT', 0, A.most)
for _, id in ipairs(ids) do redis.call('ZADD', K.due, now, id) end
local first = redis.call('ZRANGE', K.due, 0, 0, 'WITHSCORES')
if not first[1] then return {-1} end
return board_schedule(K, tonumber(first[2]), A.gap_ms, A.grace_ms)
""",
)

FINISH = Script(
    """
-- The one completion of a solve: claim it once, free its thread (handing it to the next
-- parked submit), store its outcome for the caller, append it to its batch stream, and
-- take its follow-ups (owed until they have run).  A solve its caller revoked ends
-- revoked, whatever the answer was.
-- K: BOARD, SLOTS, MESSAGES, RECORD, SECRETS, BATCH, TIMES, STATS, FOLLOWUPS, and
--   K.result (the caller's result key: opaque here)
-- A.cid = captcha id (absent when no captcha of the solve is at the provider),
-- A.lease = lease id, A.handout (SLOTS), A.record_ttl_s, A.result = result value (absent:
-- none stored), A.revoked_result = the value stored instead for a revoked solve,
-- A.result_ttl_s, A.entry and A.revoked_entry = batch entries (absent: none),
-- A.solve_s = solve time (absent: none), A.source and A.code = what to count (absent:
-- nothing), A.lane and A.tenant (absent: not counted by lane), A.followup_grace_ms
-- returns {0} when the solve was completed already (nothing stored or emitted), else
--   {1, {given, expired}, follow-up or false, revoked (1 / 0)}: the handed-out submits
""",
    keys=("result",),
    libs=(BOARD, SLOTS, MESSAGES, RECORD, SECRETS, BATCH, TIMES, STATS, FOLLOWUPS),
    body=f"""
if A.cid and not board_take(K, A.cid) then return {{0}} end
if not record_close(K, A.record_ttl_s) then return {{0}} end
message_started(K, A.lease)
secrets_drop(K)
slot_release(K, A.lease)
local out = slot_handout(K, A.handout)
local revoked = record_revoked(K)
local result, entry = A.result, A.entry
if revoked then result, entry = A.revoked_result, A.revoked_entry end
if result then
  redis.call('SET', K.result, result, 'EX', A.result_ttl_s)
  redis.call('PUBLISH', K.result, result)
end
if entry then batch_append(K, entry, {STREAM_TTL}) end
if A.solve_s and not revoked then times_add(K, A.solve_s) end
if not revoked then stats_count(K, A.source, A.code) else stats_count(K, '', 'ERROR_REVOKED') end
if A.lane then
  local ending = 'failed'
  if A.solved and not revoked then ending = 'solved' end
  stats_lane(K, ending, A.lane, A.tenant)
end
local followup = followup_take(K, A.lease, A.followup_grace_ms)
local flag = 0
if revoked then flag = 1 end
return {{1, out, followup, flag}}
""",
)


@dataclass(frozen=True)
class Registered:
    """What registering a captcha asks of the caller: the round message to publish (None:
    one is due in time already), and the code of a callback that came before (None: none
    did)."""

    round: RoundDue | None
    early: str | None = None


@dataclass(frozen=True)
class Completion:
    """Everything :meth:`Board.finish` stores for one solve; built by the worker.

    ``result_key`` / ``result_value`` are opaque here: the caller's result record (the
    worker encodes Celery's); ``revoked_value`` is stored instead when the caller revoked
    the solve.  ``batch_entry`` (``revoked_entry``) is the JSON line of its batch stream.
    """

    solve_id: str
    method: str
    captcha_id: str | None = None
    result_key: str | None = None
    result_value: str | None = None
    revoked_value: str | None = None
    result_ttl_s: int = 3600
    batch_id: str | None = None
    batch_entry: str | None = None
    revoked_entry: str | None = None
    solve_time_s: float | None = None
    source: str | None = None
    error_code: str | None = None
    #: Whether it ended with an answer (else failed).
    solved: bool = False
    #: The lane and tenant it is counted under (None: not counted by lane).
    lane: str | None = None
    tenant: str | None = None


@dataclass(frozen=True)
class Finished:
    """What :meth:`Board.finish` did: ``claimed`` False when the solve had ended already;
    the solve's follow-up (JSON, owed until it has run) and whether it ended revoked."""

    claimed: bool
    handout: Handout = field(default_factory=lambda: NO_HANDOUT)
    followup: str | None = None
    revoked: bool = False


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
    #: Seconds a solve's follow-up may take to run before it is run again.
    followup_grace_s: float = 30.0


class Board:
    """The captchas at the provider, their poll schedule and every solve's completion."""

    def __init__(self, db: Db, limiter: ThreadLimiter, config: BoardConfig) -> None:
        self.db = db
        self.keys = db.keys
        self.limiter = limiter
        self.config = config
        self._register = db.bind(REGISTER)
        self._take_due = db.bind(TAKE_DUE)
        self._end_round = db.bind(END_ROUND)
        self._ensure = db.bind(ENSURE_ROUND)
        self._retire = db.bind(RETIRE)
        self._evacuate = db.bind(EVACUATE)
        self._finish = db.bind(FINISH)
        self._keep_early = db.bind(KEEP_EARLY)

    def _board_keys(self) -> dict[str, str]:
        k = self.keys
        return {
            "board": k.board(),
            "due": k.poll_due(),
            "poll_state": k.poll_state(),
            "round": k.poll_round(),
        }

    def _rounds(self) -> dict[str, int]:
        return {"gap_ms": ms(self.config.round_gap_s), "grace_ms": ms(self.config.round_grace_s)}

    # -- submit ------------------------------------------------------------------------
    def register(
        self,
        solve_id: str,
        attempt: int,
        captcha_id: str,
        job: str,
        first_poll_in_s: float,
        result: tuple[str, str, int] | None = None,
    ) -> Registered:
        """Put a submitted captcha (of attempt ``attempt`` of ``solve_id``) on the board;
        returns the round message to publish and the callback that came before it (see
        :meth:`keep_early`).  ``result``: the caller's result key, what it says while the
        captcha is at the provider, and for how long (s)."""
        keys = {
            **self._board_keys(),
            **self.limiter.lua_keys(),
            **record_keys(self.keys, solve_id),
            **early_keys(self.keys),
            "result": result[0] if result else self.keys.submission(solve_id),
        }
        args = {
            "cid": captcha_id,
            "job": job,
            "lease": solve_id,
            "handout": self.limiter.lua_handout(),
            "first_ms": ms(max(0.0, first_poll_in_s)),
            "attempt": attempt,
            "provider": self.limiter.provider,
            "ticket": early_ticket(solve_id, attempt),
            "early_ms": ms(EARLY_POLL_S),
            "record_ttl_s": self.config.record_ttl_s,
            **self._rounds(),
        }
        if result:
            args.update(submitted_record=result[1], result_ttl_s=result[2])
        reply = self._guarded(lambda: self._register(keys, args))
        return Registered(_countdown(reply[0]), text(reply[1]) if reply[1] else None)

    def keep_early(self, solve_id: str, attempt: int, captcha_id: str, code: str) -> str:
        """Keep a callback (its MAC checked) for a captcha not on the board until it is
        registered (:meth:`register` returns it).  Returns ``"kept"``, ``"registered"``
        (it is on the board now: judge it again), ``"passed"`` (that attempt is at the
        provider as another captcha, or its solve is over), ``"again"`` (one is kept for
        that attempt already) or ``"full"``."""
        keys = {
            **self._board_keys(),
            **record_keys(self.keys, solve_id),
            **early_keys(self.keys),
        }
        args = {
            "cid": captcha_id,
            "attempt": attempt,
            "ticket": early_ticket(solve_id, attempt),
            "code": code,
            "keep_ms": ms(EARLY_KEEP_S),
            "most": EARLY_MOST,
        }
        return text(self._guarded(lambda: self._keep_early(keys, args)))

    # -- poll rounds -------------------------------------------------------------------
    def take_due(self, round_at_ms: int | None, most: int) -> list[Entry]:
        """Start a round: the captchas due now (kept out of other rounds for a while)."""
        args: dict[str, Any] = {"most": most, "hold_ms": ms(self.config.round_hold_s)}
        if round_at_ms is not None:
            args["round_at"] = round_at_ms
        reply = self._guarded(lambda: self._take_due(self._board_keys(), args))
        return [_entry(*reply[i : i + 3]) for i in range(0, len(reply), 3)]

    def end_round(self, polled_at: float, again: Sequence[Again], gap_s: float) -> RoundDue | None:
        """Put unfinished captchas back; returns the next round message to publish, or
        None when one is pending in time (or nothing is left on the board)."""
        keys = {**self._board_keys(), **self.limiter.lua_keys()}
        args = {
            **self._rounds(),
            "gap_ms": ms(gap_s),
            "handout": self.limiter.lua_handout(),
            "polled_ms": ms(polled_at),
            "again": [[a.captcha_id, a.lease_id, ms(max(0.0, a.delay_s)), a.errors] for a in again],
        }
        return _countdown(self._guarded(lambda: self._end_round(keys, args)))

    def ensure_round(self) -> RoundDue | None:
        """A round message to publish when captchas are on the board and none is pending
        (its message was lost), else None."""
        return _countdown(self._guarded(lambda: self._ensure(self._board_keys(), self._rounds())))

    def retire(
        self,
        captcha_id: str,
        solve_id: str,
        next_job: str,
        deadline_in_s: float,
        code: str,
        reason: str = "other",
    ) -> bool:
        """Take a failed captcha off the board; its solve keeps its slot and is owed a
        submit message for ``next_job`` (a new captcha, for ``reason``).  False when it was
        not on the board any more."""
        keys = {
            **self._board_keys(),
            **self.limiter.lua_keys(),
            **stats_keys(self.keys, "-"),
            "resubmits": self.keys.resubmits(),
        }
        args = {
            "cid": captcha_id,
            "lease": solve_id,
            "job": next_job,
            "deadline_ms": ms(max(0.0, deadline_in_s)),
            "handout": self.limiter.lua_handout(),
            "code": code,
            "reason": reason,
        }
        return bool(self._guarded(lambda: self._retire(keys, args)))

    def evacuate(self, most: int = 1000) -> RoundDue | None:
        """Make every captcha on the board due now (the provider is out of rotation: the
        round that takes them submits each elsewhere); returns the round message to
        publish, or None."""
        args = {**self._rounds(), "most": most}
        return _countdown(self._guarded(lambda: self._evacuate(self._board_keys(), args)))

    # -- the one completion path -------------------------------------------------------
    def finish(self, done: Completion, client: Any = None) -> Finished:
        """Complete a solve (see ``FINISH``).  With ``client`` (a pipeline) the call is
        queued and its reply is read with :func:`finished` after ``execute()``."""
        keys, args = self._finish_call(done)
        if client is not None:
            self._finish(keys, args, client=client)
            return Finished(False)
        return finished(self._guarded(lambda: self._finish(keys, args)))

    def _finish_call(self, done: Completion) -> tuple[dict[str, str], dict[str, Any]]:
        k = self.keys
        keys = {
            **self._board_keys(),
            **self.limiter.lua_keys(),
            **record_keys(k, done.solve_id),
            **secrets_keys(k, done.solve_id),
            **batch_keys(k, done.batch_id),
            **times_keys(k, done.method),
            **stats_keys(k, done.method),
            **followup_keys(k, done.solve_id),
            "result": done.result_key or k.submission(done.solve_id),
        }
        args: dict[str, Any] = {
            "lease": done.solve_id,
            "handout": self.limiter.lua_handout(),
            "record_ttl_s": self.config.record_ttl_s,
            "result_ttl_s": done.result_ttl_s,
            "followup_grace_ms": ms(self.config.followup_grace_s),
        }
        optional = {
            "cid": done.captcha_id,
            "result": done.result_value if done.result_key else None,
            "revoked_result": done.revoked_value if done.result_key else None,
            "entry": done.batch_entry,
            "revoked_entry": done.revoked_entry,
            "solve_s": None if done.solve_time_s is None else f"{done.solve_time_s:.3f}",
            "source": done.source,
            "code": done.error_code,
            "lane": done.lane,
            "tenant": done.tenant if done.lane else None,
            "solved": done.solved or None,
        }
        args.update({name: value for name, value in optional.items() if value is not None})
        return keys, args

    def run(self, pipe: Any) -> list[Any]:
        """Execute a pipeline of queued calls (Redis outages become StoreUnavailable)."""
        return list(self._guarded(pipe.execute))

    # -- reading -----------------------------------------------------------------------
    def lookup(self, captcha_id: str, solve_id: str) -> tuple[Entry | None, bool]:
        """The captcha as a round would take it (None when it is not on the board), and
        whether ``solve_id`` has ended with this captcha (a callback for it is a replay)."""
        k = self.keys
        pipe = self.db.pipeline()
        pipe.hget(k.board(), captcha_id)
        pipe.hget(k.poll_state(), captcha_id)
        pipe.hmget(k.submission(solve_id), "captcha_id", "done", "provider")
        job, state, (last, done, provider) = self._guarded(pipe.execute)
        entry = None if job is None else _entry(captcha_id, job, state or "")
        same = last is not None and text(last) == captcha_id
        here = provider is None or text(provider) == self.limiter.provider
        return entry, done is not None and same and here

    def in_flight_count(self) -> int:
        r = self.db.redis
        return int(self._guarded(lambda: r.hlen(self.keys.board())))

    def _guarded(self, call: Callable[[], T]) -> T:
        return self.db.guard(call, "the board is unavailable")


def finished(reply: Any) -> Finished:
    """A FINISH reply as a value."""
    if int(reply[0]) == 0:
        return Finished(False)
    followup = text(reply[2]) if reply[2] else None
    return Finished(True, handed_out(reply[1]), followup, bool(int(reply[3])))


def _entry(captcha_id: Any, job: Any, state: Any) -> Entry:
    polled, _, errors = text(state).partition("|")
    polled_at = int(polled) / 1000 if polled else None
    return Entry(text(captcha_id), text(job), polled_at, int(errors or 0))


def _countdown(reply: Any) -> RoundDue | None:
    countdown = int(reply[0])
    return None if countdown < 0 else RoundDue(countdown / 1000, int(reply[1]))

"""The board: every captcha at the provider, when to poll it next, and how each solve ends.

A submitted captcha is *registered* with its job and its first poll time.  Polls run in
*rounds*: a round takes every captcha that is due (one ``res.php?ids=`` request answers up
to 100 of them), and puts the unfinished ones back with their next poll time.  One round
message is pending at a time (``poll_round`` holds when it is due); registering a captcha
due sooner schedules an earlier one.  A round marks the captchas it took as not due for a
while, so a round that dies with its worker loses nothing: they come due again.

Every solve ends in :meth:`Board.finish`, which claims the solve exactly once (a poll, a
bulk poll, a provider callback or a pool hit: whichever comes first), stores the outcome
under the caller's result key, appends it to the solve's batch stream, frees its thread
and hands it to the next parked submit, and counts it: three scripts in one round trip
(``board/finish_claim``, ``finish_free``, ``finish_tally``), the first doing what the caller
must never miss, the others acting only on what it left in the solve's record (a process
that dies between them loses a count at most: the thread's lease runs out).  Each step is
made of Lua functions of the modules that own the keys (the limiter's slots, the solve's
record, the batch stream, the solve times, the counters); the board's scripts only put
them together.  A captcha
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
from ..core.job import Job
from ..core.rounds import Again, Entry, RoundDue
from ..errors import StoreUnavailable
from .batches import batch_keys
from .channel import EARLY_KEEP_S, EARLY_MOST, EARLY_POLL_S, early_keys, early_ticket
from .connections import FENCE_WAIT_MS
from .db import Db
from .followups import followup_keys
from .limiter import ThreadLimiter, handed_out
from .lua import Call, Chain, Script, ms, text
from .owed import owed_keys
from .records import record_keys
from .secrets import secrets_keys
from .stats import stats_keys
from .timing import times_keys

T = TypeVar("T")

REGISTER = Script("board/register")
KEEP_EARLY = Script("board/keep_early")
TAKE_DUE = Script("board/take_due")
END_ROUND = Script("board/end_round")
ENSURE_ROUND = Script("board/ensure_round")
RETIRE = Script("board/retire")
EVACUATE = Script("board/evacuate")
#: The completion: a chain of three scripts, in one round trip.
FINISH_CLAIM = Script("board/finish_claim")
FINISH_FREE = Script("board/finish_free")
FINISH_TALLY = Script("board/finish_tally")


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
    #: A round takes the captchas due within this many seconds from now too.
    round_ahead_s: float = 0.0


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
        self._finish_claim = db.bind(FINISH_CLAIM)
        self._finish_free = db.bind(FINISH_FREE)
        self._finish_tally = db.bind(FINISH_TALLY)
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
            "lease_ms": ms(self.limiter.config.lease_s),
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
        reply, held = self._guarded(
            lambda: self.db.fenced(lambda client: self._register(keys, args, client))
        )
        if not held:
            # Behind Sentinel, a registration no replica holds may be lost with its master
            # (a switch), and its captcha, paid for, submitted again from the new one: the
            # caller holds it and registers it again (which is a no-op where it did land).
            raise StoreUnavailable(
                f"the registration of captcha {captcha_id} has not reached a replica yet "
                f"(WAIT {FENCE_WAIT_MS} ms): it is made again"
            )
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
        """Start a round: the captchas due now, or within ``round_ahead_s`` (kept out of
        other rounds for a while)."""
        args: dict[str, Any] = {
            "most": most,
            "hold_ms": ms(self.config.round_hold_s),
            "ahead_ms": ms(self.config.round_ahead_s),
        }
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
            "lease_ms": ms(self.limiter.config.lease_s),
            "polled_ms": ms(polled_at),
            "again": [
                [
                    a.captcha_id,
                    a.lease_id,
                    ms(max(0.0, a.delay_s)),
                    a.errors,
                    a.polls,
                    _polled_ms(a),
                ]
                for a in again
            ],
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
            "lease_ms": ms(self.limiter.config.lease_s),
            "grace_ms": ms(self.limiter.config.dispatch_grace_s),
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
    def finish(self, done: Completion, client: Chain | None = None) -> Finished:
        """Complete a solve: one round trip, the chain ``board/finish_claim`` (claim it
        once, store its outcome, take its follow-ups), ``finish_free`` (free its thread and
        hand it on) and ``finish_tally`` (count it).  With ``client`` (a chain of several
        completions, :meth:`Db.chain`) the calls are queued: :meth:`run` returns what
        each did."""
        calls = self._finish_calls(done)
        if client is not None:
            client.add(finished, *calls)
            return Finished(False)
        chain = self.db.chain()
        chain.add(finished, *calls)
        return self.run(chain)[0]

    def _finish_calls(self, done: Completion) -> list[Call]:
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
            **owed_keys(k),
            "result": done.result_key or k.submission(done.solve_id),
        }
        claim: dict[str, Any] = {
            "lease": done.solve_id,
            "record_ttl_s": self.config.record_ttl_s,
            "result_ttl_s": done.result_ttl_s,
            "followup_grace_ms": ms(self.config.followup_grace_s),
        }
        stored = {
            "cid": done.captcha_id,
            "result": done.result_value if done.result_key else None,
            "revoked_result": done.revoked_value if done.result_key else None,
            "entry": done.batch_entry,
            "revoked_entry": done.revoked_entry,
        }
        claim.update({name: value for name, value in stored.items() if value is not None})
        free = {"lease": done.solve_id, "handout": self.limiter.lua_handout()}
        tally: dict[str, Any] = {"lease": done.solve_id}
        counted = {
            "solve_s": None if done.solve_time_s is None else f"{done.solve_time_s:.3f}",
            "source": done.source,
            "code": done.error_code,
            "lane": done.lane,
            "tenant": done.tenant if done.lane else None,
            "solved": done.solved or None,
        }
        tally.update({name: value for name, value in counted.items() if value is not None})
        return [
            self._finish_claim.call(keys, claim),
            self._finish_free.call(keys, free),
            self._finish_tally.call(keys, tally),
        ]

    def run(self, chain: Chain) -> list[Finished]:
        """Run a chain of queued completions: what each did, in order (Redis outages become
        StoreUnavailable)."""
        return self._guarded(lambda: self.db.run_chain(chain)[0])

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

    def at_provider(self) -> dict[str, Job]:
        """The captchas on the board (the provider answered their ``in.php``): captcha id
        → its job."""
        r = self.db.redis
        board = self._guarded(lambda: r.hgetall(self.keys.board()))
        return {text(cid): Job.from_json(text(job)) for cid, job in board.items()}

    def in_flight_count(self) -> int:
        r = self.db.redis
        return int(self._guarded(lambda: r.hlen(self.keys.board())))

    def _guarded(self, call: Callable[[], T]) -> T:
        return self.db.guard(call, "the board is unavailable")


def finished(replies: list[Any]) -> Finished:
    """The replies of a completion's chain (claim, free, tally) as a value."""
    claim, free, _ = replies
    handout = handed_out(free)
    if int(claim[0]) == 0:
        return Finished(False, handout)
    followup = text(claim[1]) if claim[1] else None
    return Finished(True, handout, followup, bool(int(claim[2])))


def _entry(captcha_id: Any, job: Any, state: Any) -> Entry:
    """A board entry from its poll state, ``<polled ms>|<errors>|<polls>``."""
    polled, errors, polls = ([*text(state).split("|"), "", ""])[:3]
    polled_at = int(polled) / 1000 if polled else None
    return Entry(text(captcha_id), text(job), polled_at, int(errors or 0), int(polls or 0))


def _polled_ms(again: Again) -> int:
    """END_ROUND's last-poll time of ``again``: ms, or -1 (when the round asked), or -2
    (never polled)."""
    if again.polled_at is not None:
        return ms(again.polled_at)
    return -1 if again.asked else -2


def _countdown(reply: Any) -> RoundDue | None:
    countdown = int(reply[0])
    return None if countdown < 0 else RoundDue(countdown / 1000, int(reply[1]))

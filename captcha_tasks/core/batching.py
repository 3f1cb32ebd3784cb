"""The batch reader's decisions, without I/O: one state machine for :func:`~captcha_tasks.
batch.stream` and :func:`~captcha_tasks.aio.stream`.

In the manner of h11, a :class:`Batch` is told what happened and answers what to do next
as a value; a driver does the I/O and reports back.  The two drivers (redis-py in
:mod:`captcha_tasks.batch`, ``redis.asyncio`` in :mod:`captcha_tasks.aio`) are each one
loop over :meth:`Batch.next_action`, so they cannot drift apart.

The conversation::

    batch.saw_master(generation)        # any time: the master-change generation the driver sees
    action = batch.next_action(now)     # the clock is passed in
    Pull()             -> batch.pulled(task) | batch.ended()
    Send(index, task)  -> batch.sent(task_id, now) | batch.refused(exc)
                          | batch.unavailable(exc, now)
    ReadStream(after)  -> batch.read(entries) | batch.unavailable(exc, now)
    Look(task_ids)     -> batch.looked(traceless_ids, now) | batch.unavailable(exc, now)
    Resend(id, kwargs) -> batch.resent() | batch.unavailable(exc, now)
    Wait(seconds)      -> sleep, then ask again
    Emit(outcomes)     -> yield them to the caller
    Raise(error)       -> raise it
    AllAnswered()      -> stop
    batch.close()     -> Abandon(...) to carry out, or None (the caller left, or the batch ended)

What it decides:

* **Windowed submission**: at most ``window`` tasks are queued and unanswered at once.
* **Completion order**: each outcome is emitted when it arrives, once, with its ``index``.
* **Per-task deadline**: a task whose outcome is ``timeout_s`` late fails with
  ``ERROR_SOLVE_TIMEOUT`` (a late outcome is then dropped).
* **Redis outages are ridden out** once a task was queued: back off from
  :data:`OUTAGE_WAIT_S` ``[0]`` to ``[1]`` seconds, and go on where the batch was when Redis
  answers again.  Redis down before any task was queued fails at once, and an outage
  longer than ``timeout_s`` (every task queued before it has timed out by then) ends the
  batch with :class:`~captcha_tasks.errors.StoreUnavailable`.  It is said once when it
  starts and once when it ends: a failure again within :data:`SETTLE_S` of Redis
  answering (the driver meeting its stale connections one by one after a restart) is the
  same outage going on, and says nothing more.
* **What a master change lost** (a Sentinel failover; a restart that lost writes): when
  the driver sees the master-change generation move (:meth:`Batch.saw_master`), the stream is
  read from its start again (``"0-0"``: the new master's entries may sort before the old
  one's; entries already emitted are skipped), and the pending tasks are looked at at
  once.  Every :data:`TRACE_EVERY_S` anyway, the pending tasks at least that old are
  looked at (:class:`Look`): each one of which Redis keeps no trace (no queued message
  noted, no claim, no record, not parked or owed a message) lost its message before any
  worker took it, and is sent again under the same task id and arguments
  (:class:`Resend`).  A copy that was not lost after all is stopped by the solve's record.
* **Leaving**: whatever is still unanswered when the batch closes is cancelled.
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import errors
from .outcome import Failed

log = logging.getLogger(__name__)

#: Longest single blocking read of the batch's stream (the sync client's socket timeout is
#: longer); a read also wakes for the next task deadline.
MAX_BLOCK_S = 5.0
#: Seconds between attempts while Redis is unreachable: from the first, doubling to the last.
OUTAGE_WAIT_S = (0.2, 2.0)
#: Seconds between looks for pending tasks of which Redis lost every trace, and the age a
#: task must have to be looked at (younger, its message may still be on its way).
TRACE_EVERY_S = 5.0
#: Seconds after Redis answered again within which a new failure is the same outage.
SETTLE_S = 5.0

Task = Mapping[str, Any]
Outcome = dict[str, Any]


# -- what to do next ----------------------------------------------------------------------


@dataclass(frozen=True)
class Pull:
    """Take the next task from the caller's iterable; report :meth:`Batch.pulled` or
    :meth:`Batch.ended`."""


@dataclass(frozen=True)
class Send:
    """Queue ``task`` (a ``solve``'s keyword arguments) as the batch's task ``index``, under
    ``task_id``; report :meth:`Batch.sent`, :meth:`Batch.refused` or
    :meth:`Batch.unavailable`."""

    index: int
    task: Task = field(repr=False)  # a proxy password or cookies, maybe: never in a log
    #: The same on every try to send this index (:func:`task_id`).
    task_id: str = field(default="", compare=False)


def task_id(batch_id: str, index: int) -> str:
    """The task id of task ``index`` of batch ``batch_id``, the same on every try to send it.
    A try that failed may have reached Redis before it did (``solve`` notes the message it
    owes the workers first, and housekeeping sends a noted message that never came): the
    try after it must be that solve again, stopped by its record, not a second one paid
    for.  Written as a UUID, as Celery's own ids are."""
    digest = hashlib.sha256(f"captcha-tasks batch {batch_id}/{index}".encode()).hexdigest()
    return "-".join((digest[:8], digest[8:12], digest[12:16], digest[16:20], digest[20:32]))


@dataclass(frozen=True)
class ReadStream:
    """Read the batch's stream after entry ``after`` (the entries up to it are read and may
    be trimmed), blocking up to ``block_ms`` for the first; report :meth:`Batch.read` or
    :meth:`Batch.unavailable`."""

    after: str
    block_ms: int


@dataclass(frozen=True)
class Look:
    """Ask Redis which of these queued tasks it keeps no trace of; report
    :meth:`Batch.looked` or :meth:`Batch.unavailable`."""

    task_ids: tuple[str, ...]


@dataclass(frozen=True)
class Resend:
    """Send the solve message of a task whose every trace Redis lost again, with the same
    ``task_id`` and ``kwargs`` (``solve.apply_async(kwargs=kwargs, task_id=task_id)``);
    report :meth:`Batch.resent` or :meth:`Batch.unavailable`."""

    task_id: str
    kwargs: Mapping[str, Any] = field(repr=False)  # as Send.task


@dataclass(frozen=True)
class Wait:
    """Redis is away: wait this long before the next attempt."""

    seconds: float


@dataclass(frozen=True)
class Emit:
    """Hand these outcomes to the caller, in this order."""

    outcomes: tuple[Outcome, ...]


@dataclass(frozen=True)
class Raise:
    """The batch cannot go on: raise ``error``."""

    error: errors.CaptchaTasksError


@dataclass(frozen=True)
class AllAnswered:
    """Every task has its outcome."""


@dataclass(frozen=True)
class Abandon:
    """The batch is over: drop its stream, and mark it cancelled when ``cancel`` (then its
    ``unanswered`` queued tasks end without calling the API)."""

    batch_id: str
    cancel: bool
    unanswered: int


Action = Pull | Send | ReadStream | Look | Resend | Wait | Emit | Raise | AllAnswered


class ProtocolError(RuntimeError):
    """A driver reported an event the batch did not ask for (a bug in the driver)."""


# -- the state machine --------------------------------------------------------------------


@dataclass
class _Pending:
    task_id: str
    task: Task = field(repr=False)
    sent_at: float
    deadline: float


@dataclass
class _Outage:
    since: float
    retry_at: float
    wait_s: float
    error: errors.StoreUnavailable
    #: Already said to be over once (a failure again while it settled): says nothing more.
    told_back: bool = False


@dataclass
class Batch:
    """One batch's bookkeeping and decisions.  Times are seconds on the driver's monotonic
    clock, passed in with every event."""

    batch_id: str
    window: int
    timeout_s: float
    max_block_s: float = MAX_BLOCK_S
    #: Keyword arguments every task gets unless it names them itself (the batch's ``lane``
    #: and ``tenant``).
    defaults: Mapping[str, Any] = field(default_factory=dict)
    pending: dict[int, _Pending] = field(default_factory=dict)
    #: Tasks taken from the source and not queued yet: (index, task), oldest first.
    backlog: deque[tuple[int, Task]] = field(default_factory=deque, repr=False)
    last_id: str = "0-0"
    queued: int = 0
    source_ended: bool = False
    #: The master-change generation last seen (:meth:`saw_master`).
    generation: int = 0
    trace_every_s: float = TRACE_EVERY_S
    #: When the pending tasks are next looked at.
    look_at: float = float("-inf")
    #: Tasks to send again (task id, index), oldest first.
    resends: deque[tuple[str, int]] = field(default_factory=deque)
    _taken: int = 0
    _outbox: list[Outcome] = field(default_factory=list)
    _asked: Action | None = None
    _outage: _Outage | None = None
    #: When Redis last answered after an outage (on the driver's clock).
    _back_at: float = float("-inf")
    #: The time of the last :meth:`next_action`: what is reported happened then.
    _now: float = 0.0
    _failure: errors.CaptchaTasksError | None = None
    _closed: bool = False

    def __post_init__(self) -> None:
        if self.window < 1:
            raise errors.ValidationError(f"window must be at least 1, not {self.window}")
        if self.timeout_s <= 0:
            raise errors.ValidationError(
                f"timeout_per_task must be positive, not {self.timeout_s:g}"
            )

    # -- what to do next ------------------------------------------------------------------

    def next_action(self, now: float) -> Action:
        """The next step, at time ``now``."""
        self._now = now
        self._asked = action = self._decide(now)
        if isinstance(action, Emit):
            self._outbox = []
        return action

    def _decide(self, now: float) -> Action:
        if self._closed:
            raise ProtocolError("the batch is closed")
        if self._failure is not None:
            return Raise(self._failure)
        self._expire(now)
        if self._outbox:
            return Emit(tuple(self._outbox))
        if self._outage is not None:
            if now - self._outage.since >= self.timeout_s:
                return Raise(self._gave_up(now))
            if now < self._outage.retry_at:
                return Wait(self._outage.retry_at - now)
        recovery = self._recovery(now)
        if recovery is not None:
            return recovery
        if len(self.pending) < self.window:
            if self.backlog:
                index, task = self.backlog[0]
                return Send(index, task, task_id(self.batch_id, index))
            if not self.source_ended:
                return Pull()
        if not self.pending:
            return AllAnswered()
        return ReadStream(self.last_id, self._block_ms(now))

    def _recovery(self, now: float) -> Resend | Look | None:
        while self.resends:
            task_id, index = self.resends[0]
            pending = self.pending.get(index)
            if pending is not None and pending.task_id == task_id:
                return Resend(task_id, solve_kwargs(self.batch_id, index, pending.task))
            self.resends.popleft()  # answered (or timed out) meanwhile
        if not self.pending or now < self.look_at:
            return None
        old = [p for p in self.pending.values() if now - p.sent_at >= self.trace_every_s]
        if not old:
            # Nothing old enough yet: look when the oldest is.
            first = min(p.sent_at for p in self.pending.values())
            self.look_at = first + self.trace_every_s
            return None
        return Look(tuple(p.task_id for p in old))

    def _block_ms(self, now: float) -> int:
        first = min(p.deadline for p in self.pending.values())
        wake = min(self.max_block_s, first - now, self.look_at - now)
        return max(1, int(wake * 1000) + 1)

    def _expire(self, now: float) -> None:
        late = [i for i, p in self.pending.items() if now >= p.deadline]
        for index in late:
            pending = self.pending.pop(index)
            exc = errors.SolveTimeout(f"no result within {self.timeout_s:g}s")
            self._outbox.append(failed(index, _method(pending.task), exc))

    def _gave_up(self, now: float) -> errors.StoreUnavailable:
        assert self._outage is not None
        waited = now - self._outage.since
        untold = [f"{len(self.backlog)} task(s) were not queued"] if self.backlog else []
        if not self.source_ended:
            untold.append("the rest of the input was not read")
        self._failure = errors.StoreUnavailable(
            f"{self._outage.error.message}; the batch stopped after {waited:.0f}s without "
            f"Redis: {'; '.join(untold) or 'every task was queued'}"
        )
        return self._failure

    # -- what happened --------------------------------------------------------------------

    def pulled(self, task: Task) -> None:
        """The source gave the next task."""
        self._expect(Pull)
        self.backlog.append((self._taken, {**self.defaults, **task} if self.defaults else task))
        self._taken += 1

    def ended(self) -> None:
        """The source has no more tasks."""
        self._expect(Pull)
        self.source_ended = True

    def sent(self, task_id: str, now: float) -> None:
        """The task of the last :class:`Send` was queued as ``task_id`` (its outcome will
        carry its index)."""
        index, task = self._sending()
        self.backlog.popleft()
        self.pending[index] = _Pending(task_id, task, now, now + self.timeout_s)
        self.queued += 1
        self._redis_answered()

    def looked(self, traceless: Sequence[str], now: float) -> None:
        """The last :class:`Look` found no trace in Redis of the tasks ``traceless``: they
        are sent again."""
        self._expect(Look)
        self.look_at = now + self.trace_every_s
        lost = set(traceless)
        for index, pending in self.pending.items():
            if pending.task_id in lost:
                log.warning(
                    "batch %s: Redis lost every trace of task %d (%s); sending it again",
                    self.batch_id,
                    index,
                    pending.task_id,
                )
                self.resends.append((pending.task_id, index))
        self._redis_answered()

    def resent(self) -> None:
        """The message of the last :class:`Resend` was sent again."""
        self._expect(Resend)
        self.resends.popleft()
        self._redis_answered()

    def saw_master(self, generation: int) -> None:
        """The master-change generation the driver sees now (any time; see
        :data:`captcha_tasks.state.connections.MASTER_CHANGES`).  When it moved, the stream is read
        from its start again and the pending tasks are looked at."""
        if generation == self.generation:
            return
        log.warning(
            "batch %s: the Redis master changed; reading its results again from the start",
            self.batch_id,
        )
        self.generation = generation
        self.last_id = "0-0"
        self.look_at = float("-inf")

    def refused(self, exc: errors.ValidationError) -> None:
        """``solve`` refused the task of the last :class:`Send`: it fails, the batch goes on."""
        index, task = self._sending()
        self.backlog.popleft()
        self._outbox.append(failed(index, _method(task), exc))

    def read(self, found: Sequence[tuple[str, Outcome]]) -> None:
        """The last :class:`ReadStream` returned ``found`` (entry id, outcome), oldest first."""
        self._expect(ReadStream)
        for entry_id, outcome in found:
            self.last_id = entry_id
            if self.pending.pop(outcome["index"], None) is not None:
                self._outbox.append(outcome)
        self._redis_answered()

    def unavailable(self, exc: errors.StoreUnavailable, now: float) -> None:
        """The last :class:`Send`, :class:`ReadStream`, :class:`Look` or :class:`Resend` failed
        because Redis is away."""
        asked = self._asked
        self._expect(Send, ReadStream, Look, Resend)
        if isinstance(asked, Resend):
            # What was traceless before the outage is looked at again after it.
            self.resends.clear()
            self.look_at = float("-inf")
        if self.queued == 0:
            # Down from the start: the caller hears it at once (nothing to ride out for).
            self._failure = exc
            return
        outage = self._outage
        if outage is None:
            settling = now - self._back_at < SETTLE_S
            if not settling:
                log.warning("Redis is unavailable (%s); batch %s waits for it", exc, self.batch_id)
            first = OUTAGE_WAIT_S[0]
            self._outage = _Outage(now, now + first, first, exc, told_back=settling)
            return
        outage.wait_s = min(OUTAGE_WAIT_S[1], outage.wait_s * 2)
        outage.retry_at = now + outage.wait_s
        outage.error = exc

    def close(self) -> Abandon | None:
        """The batch is over (done, failed, or the caller left): what to clean up, if
        anything was queued."""
        if self._closed or self.queued == 0:
            self._closed = True
            return None
        self._closed = True
        return Abandon(self.batch_id, cancel=bool(self.pending), unanswered=len(self.pending))

    # -- helpers --------------------------------------------------------------------------

    def _expect(self, *kinds: type) -> None:
        if not isinstance(self._asked, kinds):
            names = "/".join(k.__name__ for k in kinds)
            raise ProtocolError(f"reported the outcome of a {names} that was not asked for")
        self._asked = None

    def _sending(self) -> tuple[int, Task]:
        self._expect(Send)
        return self.backlog[0]

    def _redis_answered(self) -> None:
        if self._outage is not None:
            if not self._outage.told_back:
                log.warning("Redis is back; batch %s goes on", self.batch_id)
            self._back_at = self._now
            self._outage = None


def failed(index: int, method: str | None, exc: errors.CaptchaTasksError) -> Outcome:
    """The failed outcome of the batch's task ``index``."""
    return {**Failed.from_exception(exc, method).to_dict(), "index": index}


def solve_kwargs(batch_id: str, index: int, task: Task) -> dict[str, Any]:
    """The keyword arguments of ``solve`` for the batch's task ``index``: the caller's, and
    where its outcome goes."""
    return {**task, "_batch": {"id": batch_id, "index": index}}


def _method(task: Task) -> str | None:
    method = task.get("method")
    return method if isinstance(method, str) else None

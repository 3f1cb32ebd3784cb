"""asyncio callers: ``await solve(...)`` and ``async for result in stream(tasks)``.

The same contract as the blocking API, for FastAPI, Starlette, aiohttp or Quart apps::

    from captcha_tasks import aio

    outcome = await aio.solve(method="turnstile", sitekey="0x4AAA...", pageurl=url)
    await aio.report(outcome, good=accepted)
    async for result in aio.stream(tasks):
        ...

How it waits, with no thread per call and no loop that polls Redis:

* :func:`solve` sends the solve message as ``solve.delay`` does (validation first, so the
  same errors, Redis down included), then subscribes to its result's channel (Celery's
  result key: the completion script PUBLISHes the stored record there, as Celery's Redis
  backend does) and, once Redis confirms the subscription, reads the key once for a record
  stored before it.  One pub/sub connection per event loop carries every subscription; a
  reader task hands each ready record (``SUCCESS``, ``FAILURE``, ``REVOKED``) to its
  waiter, decoded by Celery's own result backend, so the outcome dict and the exception
  type are those of ``solve.delay(...).get()``.
* :func:`stream` reads its batch's Redis stream with ``XREAD BLOCK``: it is the asyncio
  driver of :class:`captcha_tasks.core.batching.Batch`, whose other driver is the blocking
  :func:`captcha_tasks.batch.stream`, so both have the same semantics, Redis outages
  and what a master change lost included (its looks for traceless tasks, re-sends and
  reconnect reports are sync calls, made on the publisher thread).

A Redis that does not answer raises :class:`~captcha_tasks.errors.StoreUnavailable`, with
the message of the sync calls (``REDIS_URL``, password masked), never a redis-py error.

Both use one ``redis.asyncio`` client (one connection pool) per event loop.  It is closed
when the loop's tasks are cancelled at shutdown (``asyncio.run``, uvicorn), or by
:func:`aclose`.

Sending a solve message stays with the Celery app (``solve.apply_async``: validation,
secrets stashed in Redis, the message remembered, the broker publish).  Those are blocking
socket calls, so they run on one publisher thread shared by the whole process, never on
the event loop: a slow or unreachable Redis cannot freeze the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Mapping,
)
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from . import errors
from .batch import (
    abandon_failed,
    abandoned,
    new_batch,
    publish,
    report_reconnects,
    send_task,
)
from .core.batching import (
    Abandon,
    AllAnswered,
    Batch,
    Emit,
    Look,
    Pull,
    Raise,
    ReadStream,
    Resend,
    Send,
    Wait,
)
from .settings import Settings
from .state import State, connections
from .state.batches import AsyncBatchStreams
from .state.connections import MASTER_CHANGES, UNREACHABLE
from .state.db import Db
from .state.keys import Keys
from .state.lua import text
from .worker.app import app
from .worker.celery_compat.backend import outage_wait
from .worker.results import Results
from .worker.runtime import Runtime
from .worker.tasks import report as report_task
from .worker.tasks import solve as solve_task

log = logging.getLogger(__name__)

#: Pause before the pub/sub reader tries again after losing its connection.
RECONNECT_S = 0.5
#: What a wait's SUBSCRIBE may meet and try again, as the reader does: Redis away, or
#: redis-py's asyncio connection read by two coroutines at once (``RuntimeError`` from
#: asyncio's streams), which its reconnects can cause.
_CHANNEL_TROUBLE = (*UNREACHABLE, OSError, RuntimeError)
#: Longest wait for Redis's answer to a wait's last look at its record, at its timeout
#: (Redis away: the wait raises this much past its timeout at most).
LAST_LOOK_S = 0.5
#: ``CLIENT SETNAME`` of the asyncio connections (``CLIENT LIST`` tells them apart).
CLIENT_NAME = "captcha-tasks-aio"

Task = Mapping[str, Any]
T = TypeVar("T")


async def solve(
    method: str | None = None,
    sitekey: str | None = None,
    pageurl: str | None = None,
    *,
    timeout: float | None = None,
    **params: Any,
) -> dict[str, Any]:
    """Solve one captcha and return its outcome dict, as ``solve.delay(...).get()`` does.

    Bad arguments raise :class:`~captcha_tasks.errors.ValidationError` before anything is
    sent, and Redis down :class:`~captcha_tasks.errors.StoreUnavailable`, as
    ``solve.delay`` does; a failed solve raises the same typed error as ``get()``
    (``ProxyError``, ``SolveTimeout``, ...).

    ``timeout``: seconds to wait for the outcome once the solve is sent, as
    ``get(timeout=...)``.  A Redis outage meanwhile is waited out; when the time is up,
    Redis is asked once more: :class:`~captcha_tasks.errors.StoreUnavailable` if it does
    not answer, the outcome if it was stored after all, else ``TimeoutError``.  None (the
    default) waits as long as the solve takes.
    """
    kwargs = {"method": method, "sitekey": sitekey, "pageurl": pageurl, **params}
    if timeout is not None and not timeout > 0:
        raise errors.ValidationError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    hub = _hubs().hub()
    sent = await _publish(partial(_send_solve, kwargs))
    record = await hub.wait_result(_result_key(sent.id), timeout)
    return _outcome(record)


async def report(result: Mapping[str, Any], *, good: bool, score: float | None = None) -> None:
    """Flag a solved token as accepted (``good=True``) or rejected by the target site, as
    ``report`` does: at the provider that solved it, and counted for the site's acceptance
    of that provider's tokens (``score``: the reCAPTCHA v3 score the site returned).  Bad
    arguments raise :class:`~captcha_tasks.errors.ValidationError`; the report message is
    sent on the publisher thread, never on the event loop."""
    await _publish(partial(report_task, dict(result), good=good, score=score))


def stream(
    tasks: Iterable[Task] | AsyncIterable[Task],
    *,
    timeout_per_task: float | None = None,
    window: int | None = None,
    lane: str | None = None,
    tenant: str | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Solve ``tasks`` and yield each outcome dict, with its input ``index``, in completion
    order: :func:`captcha_tasks.batch.stream` for ``async for``.

    ``tasks`` may be an iterable or an async iterable of ``solve`` keyword arguments;
    ``lane`` and ``tenant`` are the defaults of the tasks that name none, as in ``stream()``.
    Leaving the loop (``break``, an exception, the task being cancelled) cancels what was
    not submitted yet; ``async with contextlib.aclosing(stream(...))`` makes that happen
    at once rather than when the generator is collected.
    """
    runtime = app.runtime()
    batch = new_batch(runtime.settings, window, timeout_per_task, lane=lane, tenant=tenant)
    return _drive(runtime, batch, _iterate(tasks))


async def _drive(
    runtime: Runtime, batch: Batch, source: AsyncIterator[Task]
) -> AsyncIterator[dict[str, Any]]:
    """Carry out ``batch``'s decisions until it is done (the async generator
    :func:`stream` returns, once its arguments are checked)."""
    hub = _hubs().hub()
    try:
        while True:
            batch.saw_master(MASTER_CHANGES.generation)
            action = batch.next_action(time.monotonic())
            if isinstance(action, Emit):
                for outcome in action.outcomes:
                    yield outcome
            elif isinstance(action, Pull):
                await _pull(source, batch)
            elif isinstance(action, Send):
                await _send(batch, action)
            elif isinstance(action, ReadStream):
                await _read(hub.batches, runtime.state, batch, action)
            elif isinstance(action, Look):
                await _look(runtime.state, batch, action)
            elif isinstance(action, Resend):
                await _resend(batch, action)
            elif isinstance(action, Wait):
                await asyncio.sleep(action.seconds)  # back-off while Redis is away
            elif isinstance(action, Raise):
                raise action.error
            else:
                assert isinstance(action, AllAnswered)
                return
    finally:
        await _abandon(hub.batches, batch.close())


async def aclose() -> None:
    """Close this event loop's Redis connections (they reopen on the next call)."""
    hub = _hubs().hubs.get(asyncio.get_running_loop())
    if hub is not None:
        await hub.close()


# -- this process's connections -----------------------------------------------------------


class Hubs:
    """The asyncio API's connections in one process, kept with the app's runtime: one
    :class:`_Hub` per event loop, and the one thread that publishes solve messages."""

    def __init__(self, settings: Settings, db: Db) -> None:
        self.settings = settings
        self.db = db  # the sync state's: its errors name REDIS_URL as every sync call's do
        self.hubs: dict[asyncio.AbstractEventLoop, _Hub] = {}
        self.publisher = ThreadPoolExecutor(1, thread_name_prefix="captcha-tasks-publish")

    def hub(self) -> _Hub:
        """The running loop's hub (built on first use)."""
        loop = asyncio.get_running_loop()
        hub = self.hubs.get(loop)
        if hub is None:
            for closed in [other for other in self.hubs if other.is_closed()]:
                del self.hubs[closed]
            client = connections.async_redis_client(self.settings, client_name=CLIENT_NAME)
            hub = self.hubs[loop] = _Hub(self, loop, client, Keys(self.settings.redis.key_prefix))
        return hub


def _hubs() -> Hubs:
    runtime = app.runtime()
    return runtime.resource("aio", lambda: Hubs(runtime.settings, runtime.state.db))


async def _publish(call: Callable[[], T]) -> T:
    """A blocking call of the sync API (``solve.apply_async``: validation, Redis, the
    broker) on the publisher thread, with its errors."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_hubs().publisher, call)


def _send_solve(kwargs: dict[str, Any]) -> Any:
    """``solve.apply_async``, unwatched by Celery: the hub waits for the outcome."""
    with app.backend.unwatched():
        return solve_task.apply_async(kwargs=kwargs)


def _result_key(task_id: str) -> str:
    return Results(app).key(task_id)


def _ready(record: str) -> bool:
    """Whether a result record ends the wait (a solve in flight also says where it is)."""
    try:
        return Results(app).read(record).ready
    except (ValueError, KeyError, TypeError):
        return False


def _outcome(record: str) -> dict[str, Any]:
    """The outcome in a stored result record, or its error raised (as ``get()`` does)."""
    return Results(app).read(record).outcome()


# -- one Redis client and pub/sub reader per event loop -----------------------------------


@dataclass
class _Waiter:
    record: asyncio.Future[str]


@dataclass
class _Hub:
    """One event loop's Redis client, pub/sub connection and the solves waiting on it."""

    owner: Hubs
    loop: asyncio.AbstractEventLoop
    redis: aioredis.Redis
    keys: Keys
    waiters: dict[str, _Waiter] = field(default_factory=dict)
    subscribing: asyncio.Lock = field(default_factory=asyncio.Lock)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    batches: AsyncBatchStreams = field(init=False)
    lost: bool = False  #: the pub/sub connection is down (said once per outage)
    #: The error that took it down (for the StoreUnavailable of a wait that times out).
    lost_error: BaseException | None = None
    #: Channels just subscribed, whose records are read once (by one task, with MGET).
    unread: set[str] = field(default_factory=set)
    rereader: asyncio.Task[None] | None = None
    #: The pub/sub connection met an error: the reader replaces it before it reads again.
    stale: bool = False

    def __post_init__(self) -> None:
        self.batches = AsyncBatchStreams(self.redis, self.owner.db)
        self.pubsub = self.redis.pubsub()
        # The reader is also the hub's keeper: cancelled at the loop's shutdown, it closes
        # the connections.
        self.reader = self.loop.create_task(self._read(), name="captcha-tasks-results")

    async def wait_result(self, channel: str, timeout: float | None = None) -> str:
        """Subscribe to ``channel`` and return the ready record published there (or stored
        before the subscription took effect), within ``timeout`` seconds (None: no limit);
        a Redis outage meanwhile is waited out (see :func:`solve`)."""
        deadline = None if timeout is None else self.loop.time() + timeout
        waiter = _Waiter(self.loop.create_future())
        self.waiters[channel] = waiter
        try:
            await self._subscribe(channel, deadline, timeout)
            self.started.set()
            left = None if deadline is None else max(0.0, deadline - self.loop.time())
            try:
                return await asyncio.wait_for(waiter.record, left)
            except TimeoutError:
                return await self._last_look(channel, timeout)
        finally:
            del self.waiters[channel]
            if not self.reader.done():
                # Best effort: a channel left subscribed is ignored (no waiter), and the
                # caller's own outcome or cancellation must not turn into ours.  A
                # connection redis-py is tearing down raises AttributeError here.
                with contextlib.suppress(RedisError, OSError, AttributeError, RuntimeError):
                    async with self.subscribing:
                        await self.pubsub.unsubscribe(channel)

    async def _subscribe(self, channel: str, deadline: float | None, timeout: float | None) -> None:
        tries = 0
        while True:
            try:
                async with self.subscribing:  # one SUBSCRIBE at a time on the shared connection
                    await self.pubsub.subscribe(channel)
                # It answered: the channel is back, whether or not the reader, pausing
                # between its own tries, has seen it yet (a wait that times out now is a
                # timeout, not an outage).
                self._back()
                return
            except _CHANNEL_TROUBLE as exc:
                tries += 1
                left = None if deadline is None else deadline - self.loop.time()
                pause = outage_wait(tries, left)
                if pause is None:
                    raise self._gone(exc, timeout) from None
            await asyncio.sleep(pause)  # a back-off while Redis is away

    async def _last_look(self, channel: str, timeout: float | None) -> str:
        """At the timeout, Redis itself says why no outcome came: the record, if it was
        stored after all (its publication missed while the channel was lost); else
        ``TimeoutError`` if Redis answers, :class:`~captcha_tasks.errors.StoreUnavailable`
        if it does not within :data:`LAST_LOOK_S`.  Asked, not taken from the reader's
        ``lost`` flag, which lags: the reader may be between its tries when Redis is back,
        or meet a reconnect of the shared connection by a subscribe."""
        try:
            record = await asyncio.wait_for(self.redis.get(channel), LAST_LOOK_S)
        except UNREACHABLE as exc:
            raise self._gone(exc, timeout) from None
        except TimeoutError:  # no answer in time: why the reader last lost it, if it did
            why = self.lost_error or ConnectionError(f"no answer within {LAST_LOOK_S:g} s")
            raise self._gone(why, timeout) from None
        if record is not None and _ready(text(record)):
            return text(record)
        raise TimeoutError(f"no outcome within {timeout:g} s")

    def _back(self) -> None:
        if self.lost:
            log.warning("result channel is back")
            self.lost = False

    def _gone(self, exc: BaseException, timeout: float | None) -> errors.StoreUnavailable:
        return self.owner.db.unavailable(
            exc, f"no answer within the timeout of {timeout or 0:g} s; the solve goes on"
        )

    async def _read(self) -> None:
        """Read the pub/sub connection, for as long as the loop runs.  No error of the
        connection ends it: after any, it is replaced by a new one, subscribed to every
        channel waited on (an error that ended this reader would fail every wait on the
        loop as "closed").  Redis away is the expected one; two coroutines reading the
        connection at once (``RuntimeError`` from asyncio's streams), which redis-py's
        reconnects can cause, is another (a CI run lost every wait to it)."""
        try:
            while True:
                await self.started.wait()  # a channel is subscribed
                try:
                    async with self.subscribing:
                        # never read while a SUBSCRIBE (re)connects the shared connection
                        if self.stale:
                            await self._replace()
                            continue
                    message = await self.pubsub.get_message(timeout=None)
                except Exception as exc:
                    self._lose(exc)
                    await asyncio.sleep(RECONNECT_S)
                    continue
                self._back()
                if message:
                    self._dispatch(message)
        except Exception:
            log.exception("the result channel's reader failed; its waits end")
            raise
        finally:
            await self._shutdown()

    def _lose(self, exc: Exception) -> None:
        expected = isinstance(exc, (*UNREACHABLE, OSError))
        if not self.lost:
            # _replace subscribes a new connection; _dispatch then re-reads the records
            # that may have been published meanwhile.
            log.warning(
                "result channel lost (%s: %s); reconnecting",
                type(exc).__name__,
                exc,
                exc_info=not expected,
            )
            self.lost = True
        self.lost_error = exc
        self.stale = True

    async def _replace(self) -> None:
        """A new pub/sub connection in place of the one that met an error (called holding
        ``subscribing``), subscribed to the channels waited on; with none, the reader
        waits for the next wait's subscription."""
        old, self.pubsub = self.pubsub, self.redis.pubsub()
        with contextlib.suppress(Exception):
            await old.aclose()  # type: ignore[no-untyped-call,unused-ignore]
        channels = list(self.waiters)
        if channels:
            await self.pubsub.subscribe(*channels)  # an error: lost again, tried again
        else:
            self.started.clear()
        self.stale = False

    def _dispatch(self, message: dict[str, Any]) -> None:
        waiter = self.waiters.get(text(message["channel"]))
        if waiter is None:
            return
        if message["type"] == "message":
            _settle(waiter.record, text(message["data"]))
        elif message["type"] == "subscribe":
            # Subscribed (or again, after a reconnect): a record stored before then was
            # published to nobody.
            self.unread.add(text(message["channel"]))
            if self.rereader is None or self.rereader.done():
                self.rereader = self.loop.create_task(self._reread())

    async def _reread(self) -> None:
        while self.unread:
            channels = [c for c in self.unread if c in self.waiters]
            self.unread.clear()
            if not channels:
                continue
            try:
                records = await self.redis.mget(channels)
            except RedisError:
                return  # the channel is lost too: read again when it is back
            for channel, record in zip(channels, records, strict=True):
                waiter = self.waiters.get(channel)
                if record is not None and waiter is not None:
                    _settle(waiter.record, text(record))

    async def close(self) -> None:
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.reader

    async def _shutdown(self) -> None:
        if self.owner.hubs.get(self.loop) is self:
            del self.owner.hubs[self.loop]
        closed = errors.StoreUnavailable("this event loop's Redis client was closed")
        for waiter in self.waiters.values():
            if not waiter.record.done():
                waiter.record.set_exception(closed)
        with contextlib.suppress(RedisError, OSError):
            await self.pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]
        with contextlib.suppress(RedisError, OSError):
            await self.redis.aclose()


def _settle(future: asyncio.Future[str], record: str) -> None:
    if not future.done() and _ready(record):
        future.set_result(record)


# -- streams ------------------------------------------------------------------------------


async def _iterate(tasks: Iterable[Task] | AsyncIterable[Task]) -> AsyncIterator[Task]:
    if isinstance(tasks, AsyncIterable):
        async for task in tasks:
            yield task
    else:
        for task in tasks:
            yield task


async def _pull(source: AsyncIterator[Task], batch: Batch) -> None:
    try:
        task = await anext(source)
    except StopAsyncIteration:
        batch.ended()
    else:
        batch.pulled(task)


async def _send(batch: Batch, action: Send) -> None:
    try:
        task_id = await _publish(partial(send_task, batch.batch_id, action))
    except errors.ValidationError as exc:
        batch.refused(exc)
    except errors.StoreUnavailable as exc:
        batch.unavailable(exc, time.monotonic())
    else:
        batch.sent(task_id, time.monotonic())


async def _read(streams: AsyncBatchStreams, state: State, batch: Batch, action: ReadStream) -> None:
    try:
        found = await streams.read(batch.batch_id, action.after, block_ms=action.block_ms)
    except errors.StoreUnavailable as exc:
        batch.unavailable(exc, time.monotonic())
    else:
        batch.read(found)
        if MASTER_CHANGES.reconnects:  # a thread hop only when there is something to add
            await _publish(partial(report_reconnects, state))


async def _look(state: State, batch: Batch, action: Look) -> None:
    try:
        lost = await _publish(partial(state.records.traceless, action.task_ids))
    except errors.StoreUnavailable as exc:
        batch.unavailable(exc, time.monotonic())
    else:
        batch.looked(lost, time.monotonic())


async def _resend(batch: Batch, action: Resend) -> None:
    try:
        await _publish(partial(publish, action.task_id, action.kwargs))
    except errors.StoreUnavailable as exc:
        batch.unavailable(exc, time.monotonic())
    else:
        batch.resent()


#: Batch cancellations under way, kept from the garbage collector until they are done.
_ABANDONING: set[asyncio.Future[None]] = set()


async def _abandon(streams: AsyncBatchStreams, abandon: Abandon | None) -> None:
    if abandon is None:
        return  # nothing was queued (Redis down at the first task, say): nothing to cancel
    # Shielded: a caller cancelled by a cancel scope (anyio's, as Starlette's when a client
    # leaves a streaming response) is cancelled again at every await of its cleanup, and
    # the batch would go on, paid for, until its captchas ran out.
    done = asyncio.ensure_future(_abandon_now(streams, abandon))
    _ABANDONING.add(done)
    done.add_done_callback(_ABANDONING.discard)
    await asyncio.shield(done)


async def _abandon_now(streams: AsyncBatchStreams, abandon: Abandon) -> None:
    try:
        await streams.abandon(abandon.batch_id, cancel=abandon.cancel)
    except Exception as exc:  # never hide the caller's own exception (a cancellation) behind ours
        abandon_failed(abandon, exc)
    else:
        abandoned(abandon)

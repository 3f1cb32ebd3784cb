"""asyncio callers: ``await solve(...)`` and ``async for result in stream(tasks)``.

The same contract as the blocking API, for FastAPI, Starlette, aiohttp or Quart apps::

    from captcha_tasks import aio

    outcome = await aio.solve(method="turnstile", sitekey="0x4AAA...", pageurl=url)
    async for result in aio.stream(tasks):
        ...

How it waits, with no thread per call and no loop that polls Redis:

* :func:`solve` subscribes to its result's channel (Celery's result key: the completion
  script PUBLISHes the stored record there, as Celery's Redis backend does), waits until
  Redis confirms the subscription, and only then sends the solve message.  One pub/sub
  connection per event loop carries every subscription; a reader task hands each record to
  its waiter, decoded by Celery's own result backend, so the outcome dict and the exception
  type are those of ``solve.delay(...).get()``.
* :func:`stream` reads its batch's Redis stream with ``XREAD BLOCK``, like the blocking
  :func:`captcha_tasks.stream.stream`, whose bookkeeping it shares.

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
import uuid
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
)
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import connections, errors
from .keys import Keys
from .settings import Settings
from .state.batches import CANCEL_TTL, entries
from .state.lua import text
from .stream import TRACE_EVERY_S, Batch, Outage, recover_lost, rejected
from .worker.app import app
from .worker.results import Results
from .worker.tasks import normalize_solve_args
from .worker.tasks import solve as solve_task

log = logging.getLogger(__name__)

#: Longest single ``XREAD BLOCK`` of a stream (it also wakes for the next task timeout).
MAX_BLOCK_MS = 10_000
#: Pause before the pub/sub reader tries again after losing its connection.
RECONNECT_S = 0.5
#: ``CLIENT SETNAME`` of the asyncio connections (``CLIENT LIST`` tells them apart).
CLIENT_NAME = "captcha-tasks-aio"

Task = Mapping[str, Any]


async def solve(
    method: str, sitekey: str | None = None, pageurl: str | None = None, **params: Any
) -> dict[str, Any]:
    """Solve one captcha and return its outcome dict, as ``solve.delay(...).get()`` does.

    Bad arguments raise :class:`~captcha_tasks.errors.ValidationError` before anything is
    sent; a failed solve raises the same typed error as ``get()`` (``ProxyError``,
    ``SolveTimeout``, ...).  Bound the wait with ``asyncio.timeout()`` if you need to.
    """
    kwargs = {"method": method, "sitekey": sitekey, "pageurl": pageurl, **params}
    normalize_solve_args((), kwargs)  # call-site validation, before any I/O
    solve_id = str(uuid.uuid4())
    hub = _hubs().hub()

    async def send() -> None:
        await _publish(kwargs, task_id=solve_id)

    record = await hub.wait_result(_result_key(solve_id), send)
    return _outcome(record)


async def stream(
    tasks: Iterable[Task] | AsyncIterable[Task],
    *,
    timeout_per_task: float | None = None,
    window: int | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Solve ``tasks`` and yield each outcome dict, with its input ``index``, in completion
    order: :func:`captcha_tasks.stream.stream` for ``async for``.

    ``tasks`` may be an iterable or an async iterable of ``solve`` keyword arguments.
    Leaving the loop (``break``, an exception, the task being cancelled) cancels what was
    not submitted yet; ``async with contextlib.aclosing(stream(...))`` makes that happen
    at once rather than when the generator is collected.
    """
    settings = app.runtime().settings
    size = window or 2 * settings.capacity
    if size < 1:
        raise errors.ValidationError("window must be at least 1")
    batch = Batch(uuid.uuid4().hex, timeout_per_task or settings.solve_timeout + 60)
    batch.generation = connections.FAILOVERS.generation
    hub = _hubs().hub()
    source = _numbered(tasks)
    outage = Outage()
    exhausted = False
    try:
        while True:
            while not exhausted and len(batch.pending) < size:
                item = await anext(source, None)
                if item is None:
                    exhausted = True
                    break
                failure = await _queue(batch, *item)
                if failure is not None:
                    yield failure
            if exhausted and not batch.pending:
                return
            try:
                arrived = await _arrived(hub, batch)
            except errors.StoreUnavailable as exc:
                # A failover, a restart: wait for Redis, as stream() does.
                await asyncio.sleep(outage.next_wait(exc))
                arrived = []
            else:
                outage.over()
            for outcome in arrived:
                yield outcome
            for outcome in batch.timed_out():
                yield outcome
    finally:
        await _abandon(hub, batch)


async def aclose() -> None:
    """Close this event loop's Redis connections (they reopen on the next call)."""
    hub = _hubs().hubs.get(asyncio.get_running_loop())
    if hub is not None:
        await hub.close()


# -- this process's connections -----------------------------------------------------------


class Hubs:
    """The asyncio API's connections in one process, kept with the app's runtime: one
    :class:`_Hub` per event loop, and the one thread that publishes solve messages."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
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
            hub = self.hubs[loop] = _Hub(self, loop, client, Keys(self.settings.key_prefix))
        return hub


def _hubs() -> Hubs:
    runtime = app.runtime()
    return runtime.resource("aio", lambda: Hubs(runtime.settings))


async def _publish(kwargs: dict[str, Any], **options: Any) -> str:
    """``solve.apply_async`` on the publisher thread; returns the solve's id."""
    loop = asyncio.get_running_loop()
    call = partial(solve_task.apply_async, kwargs=kwargs, **options)
    result = await loop.run_in_executor(_hubs().publisher, call)
    return str(result.id)


def _result_key(task_id: str) -> str:
    return text(app.backend.get_key_for_task(task_id))


def _outcome(record: str) -> dict[str, Any]:
    """The outcome in a stored result record, or its error raised (as ``get()`` does)."""
    return Results(app).read(record).outcome()


def _ready(record: str) -> bool:
    """Whether a record ends the wait (a solve in flight also says where it is)."""
    return Results(app).read(record).ready


# -- one Redis client and pub/sub reader per event loop -----------------------------------


@dataclass
class _Waiter:
    confirmed: asyncio.Future[None]
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

    def __post_init__(self) -> None:
        self.pubsub = self.redis.pubsub()
        # The reader is also the hub's keeper: cancelled at the loop's shutdown, it closes
        # the connections.
        self.reader = self.loop.create_task(self._read(), name="captcha-tasks-results")

    async def wait_result(self, channel: str, send: Callable[[], Awaitable[None]]) -> str:
        """Subscribe to ``channel``, run ``send()`` once Redis confirmed it, and return the
        record published there."""
        waiter = _Waiter(self.loop.create_future(), self.loop.create_future())
        self.waiters[channel] = waiter
        try:
            async with self.subscribing:  # one SUBSCRIBE at a time on the shared connection
                await self.pubsub.subscribe(channel)
            self.started.set()
            await waiter.confirmed
            await send()
            return await waiter.record
        finally:
            del self.waiters[channel]
            if not self.reader.done():
                with contextlib.suppress(RedisError):
                    async with self.subscribing:
                        await self.pubsub.unsubscribe(channel)

    async def _read(self) -> None:
        try:
            await self.started.wait()
            while True:
                try:
                    message = await self.pubsub.get_message(timeout=None)
                except (RedisConnectionError, RedisTimeoutError) as exc:
                    # redis-py re-subscribes on reconnect; _dispatch then re-reads the
                    # records that may have been published meanwhile.
                    log.warning("result channel lost (%s); reconnecting", exc)
                    await asyncio.sleep(RECONNECT_S)
                    continue
                if message:
                    self._dispatch(message)
        finally:
            await self._shutdown()

    def _dispatch(self, message: dict[str, Any]) -> None:
        waiter = self.waiters.get(text(message["channel"]))
        if waiter is None:
            return
        if message["type"] == "message" and _ready(text(message["data"])):
            _settle(waiter.record, text(message["data"]))
        elif message["type"] == "subscribe":
            if waiter.confirmed.done():  # subscribed again after a reconnect
                self.loop.create_task(self._reread(text(message["channel"])))
            else:
                waiter.confirmed.set_result(None)

    async def _reread(self, channel: str) -> None:
        with contextlib.suppress(RedisError):
            record = await self.redis.get(channel)
            waiter = self.waiters.get(channel)
            if record is not None and waiter is not None and _ready(text(record)):
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
            for future in (waiter.confirmed, waiter.record):
                if not future.done():
                    future.set_exception(closed)
        with contextlib.suppress(RedisError, OSError):
            await self.pubsub.aclose()  # type: ignore[no-untyped-call]
        with contextlib.suppress(RedisError, OSError):
            await self.redis.aclose()


def _settle(future: asyncio.Future[str], value: str) -> None:
    if not future.done():
        future.set_result(value)


# -- streams ------------------------------------------------------------------------------


async def _numbered(tasks: Iterable[Task] | AsyncIterable[Task]) -> AsyncIterator[tuple[int, Task]]:
    if isinstance(tasks, AsyncIterable):
        index = 0
        async for task in tasks:
            yield index, task
            index += 1
    else:
        for index, task in enumerate(tasks):
            yield index, task


async def _queue(batch: Batch, index: int, task: Task) -> dict[str, Any] | None:
    kwargs = {**task, "_batch": {"id": batch.batch_id, "index": index}}
    try:
        task_id = await _publish(kwargs)
    except errors.ValidationError as exc:
        return rejected(index, task, exc)
    batch.sent(index, task_id, task.get("method"), kwargs)
    return None


async def _arrived(hub: _Hub, batch: Batch) -> list[dict[str, Any]]:
    key = hub.keys.batch_results(batch.batch_id)
    moved = batch.master_moved(connections.FAILOVERS.generation)
    if moved or batch.look_due(TRACE_EVERY_S):
        # the look is a few sync Redis calls, off the event loop
        await asyncio.get_running_loop().run_in_executor(
            hub.owner.publisher, recover_lost, app.runtime().state.records, batch, moved
        )
    wait_s = batch.next_deadline() or 0.0
    block_ms = max(1, min(MAX_BLOCK_MS, int(wait_s * 1000) + 1))
    try:
        reply = await hub.redis.xread({key: batch.last_id}, count=500, block=block_ms)
        found = entries(reply)
        if found:
            await hub.redis.xtrim(key, minid=found[-1][0])
    except (RedisConnectionError, RedisTimeoutError):
        raise errors.StoreUnavailable("Redis is down: batch results are unavailable") from None
    return batch.arrived(found)


async def _abandon(hub: _Hub, batch: Batch) -> None:
    keys = hub.keys
    try:
        async with hub.redis.pipeline(transaction=True) as pipe:
            if batch.pending:
                pipe.set(keys.batch_cancelled(batch.batch_id), "1", ex=CANCEL_TTL)
            pipe.delete(keys.batch_results(batch.batch_id))
            await pipe.execute()
        if batch.pending:
            log.info("batch %s abandoned: %d tasks cancelled", batch.batch_id, len(batch.pending))
    except Exception:  # never hide the caller's own exception (a cancellation) behind ours
        log.warning("could not cancel batch %s", batch.batch_id, exc_info=True)

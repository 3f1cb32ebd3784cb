"""Celery's Redis result backend, with ``AsyncResult.get()`` that waits out a Redis outage
within its timeout, as a solve does.

Celery's own ``get()`` on the Redis backend subscribes to the result's channel and reads
its key; a connection error on the way is retried for a few seconds (the backend's retry
policy) and then raised as it is, a redis-py ``ConnectionError`` or Celery's "the Celery
application must be restarted" ``RuntimeError``, long before the caller's timeout, and
again on the first call after a restart (a pooled connection to the old server).

Here the waiting part of ``get()`` retries instead, until the caller's ``timeout``:

* A connection error while ``get()`` subscribes or reads is an outage: after a short
  back-off (:func:`outage_wait`) the subscriptions are made again and the stored records
  read once (Celery's own reconnect, one try each time), then the wait goes on with what
  is left of the timeout.  A result stored meanwhile is found by that read.
* Past the timeout with Redis still away, :class:`~captcha_tasks.errors.StoreUnavailable`
  (REDIS_URL with its password masked), never a redis-py error.  Past it with Redis
  answering and no result, Celery's ``TimeoutError``, as always.
* What the task itself raised, and what the caller's ``on_interval`` / ``on_message``
  raise (a failed parent of a chain), is raised as it is, never mistaken for an outage.

Subscribing when a task is sent (Celery does it in ``on_task_call``) is best effort: if
Redis drops just then, ``get()`` subscribes again.  A send inside :meth:`OutageSafe.unwatched`
does not subscribe at all: its caller reads the outcome elsewhere (a batch's stream, the
asyncio API's own pub/sub connection).

Selected by ``result_backend`` (Celery's ``<class>+<url>`` form: see
:func:`captcha_tasks.worker.broker.backend_url`); the Sentinel backend is built on it too.

Celery internals this module depends on (each marked ``Celery:`` where it is used): the
Redis backend's ``ResultConsumer`` and its ``_reconnect`` / ``_reconnect_pubsub`` (its
reconnect after a connection error, which subscribes again and reads each pending
record), the async backend's ``_wait_for_pending`` generator (the wait ``get()`` drains),
``on_task_call`` and ``add_pending_result`` (the subscription made when a task is sent or
awaited) and ``_ensure_not_eager``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from celery.backends import redis as celery_redis

from ...errors import StoreUnavailable
from ...settings import mask_url
from ...state.connections import UNREACHABLE

log = logging.getLogger(__name__)

#: The first pause after a failed try, doubled after each one up to :data:`RETRY_MAX_S`.
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 1.0
#: What an outage looks like from redis-py: no connection, no answer, a server that is
#: loading its data or was demoted (UNREACHABLE), or a socket error.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (*UNREACHABLE, redis.BusyLoadingError, OSError)


def outage_wait(tries: int, left: float | None) -> float | None:
    """Seconds to pause after ``tries`` failed tries in a row, with ``left`` seconds of the
    caller's timeout (None: no timeout); None when the timeout is spent."""
    if left is not None and left <= 0:
        return None
    pause: float = min(RETRY_MAX_S, RETRY_FIRST_S * 2.0 ** max(0, tries - 1))
    return pause if left is None else min(pause, left)


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis is unreachable: a connection error, or Celery's
    ``RuntimeError`` raised from one (its reconnect gave up)."""
    if isinstance(exc, OUTAGE_ERRORS):
        return True
    cause = exc.__cause__
    return isinstance(exc, RuntimeError) and cause is not None and is_outage(cause)


class _CallerRaised(Exception):
    """What the caller's own callback raised inside the wait: raised again as it is."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def _marked(callback: Callable[..., Any] | None) -> Callable[..., Any] | None:
    if callback is None:
        return None

    def call(*args: Any) -> Any:
        try:
            return callback(*args)
        except Exception as exc:
            raise _CallerRaised(exc) from exc

    return call


@contextmanager
def _raised(flag: threading.local) -> Iterator[None]:
    """Set this thread's ``flag.now`` while inside (as it was again on the way out)."""
    outer = getattr(flag, "now", False)
    flag.now = True
    try:
        yield
    finally:
        flag.now = outer


class ResultConsumer(celery_redis.ResultConsumer):
    """Celery's pub/sub reader of results; inside a ``get()`` of ours it reconnects once
    per try, and the ``get()`` decides when to try again (its timeout, not the backend's
    retry policy, bounds the wait)."""

    def _reconnect(self) -> None:
        # Celery: the consumer's reconnect after a connection error; inside our wait, one
        # try (_reconnect_pubsub: subscribe again, read each pending record), no retries.
        if getattr(getattr(self.backend, "waiting", None), "now", False):
            self._reconnect_pubsub()
        else:
            super()._reconnect()


class OutageSafe:
    """The part of :class:`RedisBackend` that waits out outages (mixed into the Sentinel
    backend too)."""

    ResultConsumer = ResultConsumer
    # Celery's backend attributes this mixin uses.
    result_consumer: Any
    url: str | None
    _wait_for_pending: Callable[..., Iterator[None]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: Per thread: inside a wait of ours (its own reconnect is one try).
        self.waiting = threading.local()
        #: The subscriptions were lost (a failed subscribe or read): made again first.
        self.resubscribe = False
        #: Per thread: inside :meth:`unwatched`.
        self._unwatched = threading.local()
        super().__init__(*args, **kwargs)

    @contextmanager
    def unwatched(self) -> Iterator[None]:
        """Tasks sent inside (on this thread) are not subscribed to: for callers that read
        their outcomes elsewhere.  Nor is there anything to unsubscribe when the
        ``AsyncResult`` they get back is collected.  Celery unsubscribes from
        ``AsyncResult.__del__``, and a Ctrl-C that lands in that UNSUBSCRIBE is swallowed
        ("Exception ignored in"): a CI run's batch ran on after its Ctrl-C so.  It also
        saves each task a SUBSCRIBE and an UNSUBSCRIBE."""
        with _raised(self._unwatched):
            yield

    def on_task_call(self, producer: Any, task_id: str) -> None:
        # Celery: called by send_task to subscribe to the result's channel at once.
        if getattr(self._unwatched, "now", False):
            return
        try:
            with self._inside():
                super().on_task_call(producer, task_id)  # type: ignore[misc]
        except Exception as exc:
            if not is_outage(exc):
                raise
            self.resubscribe = True  # get() subscribes again

    def add_pending_result(
        self, result: Any, weak: bool = False, start_drainer: bool = True
    ) -> Any:
        # Celery: called by AsyncResult before a wait, to subscribe to its channel.
        try:
            with self._inside():
                return super().add_pending_result(  # type: ignore[misc]
                    result, weak=weak, start_drainer=start_drainer
                )
        except Exception as exc:
            if not is_outage(exc):
                raise
            # Registered, not subscribed: the wait that follows subscribes again.
            self.resubscribe = True
            return result

    def wait_for_pending(
        self,
        result: Any,
        callback: Any = None,
        propagate: bool = True,
        timeout: float | None = None,
        on_interval: Any = None,
        on_message: Any = None,
        **kwargs: Any,
    ) -> Any:
        # Celery: the async backend's wait_for_pending, rewritten around its own
        # _wait_for_pending generator (drained until the result is ready or time is up).
        self._ensure_not_eager()  # type: ignore[attr-defined]
        marked = {"on_interval": _marked(on_interval), "on_message": _marked(on_message)}
        try:
            with self._inside():
                self._wait_out(result, timeout, {**kwargs, **marked})
        except _CallerRaised as exc:
            raise exc.error from None
        return result.maybe_throw(callback=callback, propagate=propagate)

    def _wait_out(self, result: Any, timeout: float | None, options: dict[str, Any]) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        tries, outage = 0, None
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                if self.resubscribe:
                    self.result_consumer._reconnect_pubsub()  # subscribes, reads each record
                    self.resubscribe = False
                for _ in self._wait_for_pending(result, timeout=left, **options):
                    pass
                if outage is not None:
                    log.info("Redis answers again: the result's wait goes on")
                return
            except Exception as exc:
                if not is_outage(exc):
                    raise
                if outage is None:
                    log.warning("Redis went away while a result was awaited (%s); retrying", exc)
                tries, outage, self.resubscribe = tries + 1, exc, True
            left = None if deadline is None else deadline - time.monotonic()
            pause = outage_wait(tries, left)
            if pause is None:
                raise self.unavailable(outage, timeout) from outage
            time.sleep(pause)  # a back-off while Redis is away

    def unavailable(self, exc: BaseException, timeout: float | None) -> StoreUnavailable:
        """The error of a ``get()`` whose ``timeout`` passed with Redis away."""
        return StoreUnavailable(
            f"Redis is down or REDIS_URL is wrong (REDIS_URL={mask_url(self.url or '')}; "
            f"{type(exc).__name__}: {exc}): no answer within get()'s timeout of "
            f"{timeout or 0:g} s; the solve goes on, read its result again later"
        )

    @contextmanager
    def _inside(self) -> Iterator[None]:
        with _raised(self.waiting):
            yield


class RedisBackend(OutageSafe, celery_redis.RedisBackend):
    """Celery's Redis result backend whose ``get()`` waits out an outage (module doc)."""

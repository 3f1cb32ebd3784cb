"""Batch result streams: one Redis stream per batch, appended by whichever worker finishes
a solve (inside the completion script) and read by the caller with ``XREAD``, from a sync
client (:class:`BatchStreams`) or an asyncio one (:class:`AsyncBatchStreams`); both fail
with the same :class:`~captcha_tasks.errors.StoreUnavailable` when Redis is away.

An abandoned batch is marked *cancelled*: its queued submits end without calling the API,
and nothing more is appended to its stream.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis

from .connections import UNREACHABLE
from .db import Db
from .keys import Keys
from .lua import text

T = TypeVar("T")

CANCEL_TTL = 24 * 3600
#: Seconds a batch stream is kept after its last entry (``batch.STREAM_TTL_S``).
STREAM_TTL = 24 * 3600
#: Most entries one read of a batch stream returns.
READ_COUNT = 500


def batch_keys(keys: Keys, batch_id: str | None) -> dict[str, str]:
    """The keys of ``lib/batch.lua`` for one batch (a placeholder name for none)."""
    return {
        "batch_stream": keys.batch_results(batch_id or "-"),
        "batch_cancelled": keys.batch_cancelled(batch_id or "-"),
    }


class BatchStreams:
    """The caller's side of batch streams (redis-py; :class:`AsyncBatchStreams` is the
    same over ``redis.asyncio``)."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.r = db.redis
        self.keys = db.keys

    def read(
        self, batch_id: str, after: str, *, block_ms: int, count: int = READ_COUNT
    ) -> list[tuple[str, dict[str, Any]]]:
        """Outcomes appended after entry ``after`` ("0-0": from the start), waiting up to
        ``block_ms`` for the first; each with its entry id.  The entries before ``after``
        (read already) are trimmed in the same round trip."""
        key = self.keys.batch_results(batch_id)
        pipe = self.r.pipeline(transaction=False)
        _read(pipe, key, after, block_ms, count)
        return entries(self._guarded(pipe.execute)[-1])

    def cancelled(self, batch_id: str) -> bool:
        """Whether the batch was abandoned by its caller."""
        key = self.keys.batch_cancelled(batch_id)
        return bool(self._guarded(lambda: self.r.exists(key)))

    def abandon(self, batch_id: str, cancel: bool) -> None:
        """The caller left: cancel what was not submitted (``cancel``) and drop the stream."""
        pipe = self.r.pipeline(transaction=True)
        _abandon(pipe, self.keys, batch_id, cancel)
        self._guarded(pipe.execute)

    def _guarded(self, call: Callable[[], T]) -> T:
        return self.db.guard(call, "batch results are unavailable")


class AsyncBatchStreams:
    """:class:`BatchStreams` for an asyncio caller: the same commands on a
    ``redis.asyncio`` client ``r`` of the same Redis as ``db``, the same errors."""

    def __init__(self, r: aioredis.Redis, db: Db) -> None:
        self.r = r
        self.db = db
        self.keys = db.keys

    async def read(
        self, batch_id: str, after: str, *, block_ms: int, count: int = READ_COUNT
    ) -> list[tuple[str, dict[str, Any]]]:
        """See :meth:`BatchStreams.read`."""
        key = self.keys.batch_results(batch_id)
        async with self.r.pipeline(transaction=False) as pipe:
            _read(pipe, key, after, block_ms, count)
            replies = await self._guarded(pipe.execute())
        return entries(replies[-1])

    async def abandon(self, batch_id: str, cancel: bool) -> None:
        """See :meth:`BatchStreams.abandon`."""
        async with self.r.pipeline(transaction=True) as pipe:
            _abandon(pipe, self.keys, batch_id, cancel)
            await self._guarded(pipe.execute())

    async def _guarded(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except UNREACHABLE as exc:
            raise self.db.unavailable(exc, "batch results are unavailable") from None


def _read(pipe: Any, key: str, after: str, block_ms: int, count: int) -> None:
    if after != "0-0":
        pipe.xtrim(key, minid=after)
    pipe.xread({key: after}, count=count, block=block_ms)


def _abandon(pipe: Any, keys: Keys, batch_id: str, cancel: bool) -> None:
    if cancel:
        pipe.set(keys.batch_cancelled(batch_id), "1", ex=CANCEL_TTL)
    pipe.delete(keys.batch_results(batch_id))


def entries(reply: Any) -> list[tuple[str, dict[str, Any]]]:
    """The (entry id, outcome) pairs of an ``XREAD`` reply of batch streams."""
    found: list[tuple[str, dict[str, Any]]] = []
    for _stream, items in reply or []:
        for entry_id, fields in items:
            outcome = fields.get("outcome", fields.get(b"outcome"))
            found.append((text(entry_id), json.loads(text(outcome))))
    return found

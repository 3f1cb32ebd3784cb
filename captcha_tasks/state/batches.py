"""Batch result streams: one Redis stream per batch, appended by whichever worker finishes
a solve (inside the completion script) and read by the caller with ``XREAD``.

An abandoned batch is marked *cancelled*: its queued submits end without calling the API,
and nothing more is appended to its stream.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from ..keys import Keys
from .lua import guard, text

T = TypeVar("T")

CANCEL_TTL = 24 * 3600


class BatchStreams:
    """The caller's side of batch streams."""

    def __init__(self, r: redis.Redis, keys: Keys) -> None:
        self.r = r
        self.keys = keys

    def read(
        self, batch_id: str, after: str, *, block_ms: int, count: int = 500
    ) -> list[tuple[str, dict[str, Any]]]:
        """Outcomes appended after entry ``after`` ("0-0": from the start), waiting up to
        ``block_ms`` for the first; each with its entry id."""
        key = self.keys.batch_results(batch_id)
        reply: Any = _guarded(lambda: self.r.xread({key: after}, count=count, block=block_ms))
        return entries(reply)

    def trim(self, batch_id: str, upto: str) -> None:
        """Forget the entries up to ``upto`` (they were read)."""
        key = self.keys.batch_results(batch_id)
        _guarded(lambda: self.r.xtrim(key, minid=upto))

    def cancelled(self, batch_id: str) -> bool:
        """Whether the batch was abandoned by its caller."""
        key = self.keys.batch_cancelled(batch_id)
        return bool(_guarded(lambda: self.r.exists(key)))

    def abandon(self, batch_id: str, cancel: bool) -> None:
        """The caller left: cancel what was not submitted (``cancel``) and drop the stream."""
        k = self.keys
        pipe = self.r.pipeline(transaction=True)
        if cancel:
            pipe.set(k.batch_cancelled(batch_id), "1", ex=CANCEL_TTL)
        pipe.delete(k.batch_results(batch_id))
        _guarded(pipe.execute)


def entries(reply: Any) -> list[tuple[str, dict[str, Any]]]:
    """The (entry id, outcome) pairs of an ``XREAD`` reply of batch streams."""
    found: list[tuple[str, dict[str, Any]]] = []
    for _stream, items in reply or []:
        for entry_id, fields in items:
            outcome = fields.get("outcome", fields.get(b"outcome"))
            found.append((text(entry_id), json.loads(text(outcome))))
    return found


def _guarded(call: Callable[[], T]) -> T:
    return guard(call, "batch results are unavailable")

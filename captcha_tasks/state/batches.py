"""Batch result streams: one Redis stream per batch, appended by whichever worker finishes
a solve (inside the completion script) and read by the caller with ``XREAD``.

An abandoned batch is marked *cancelled*: its queued submits end without calling the API,
and nothing more is appended to its stream.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from ..keys import Keys
from .db import Db
from .lua import Lib, text

T = TypeVar("T")

CANCEL_TTL = 24 * 3600
STREAM_TTL = 24 * 3600

#: Lua: K.batch_stream (stream of one batch's outcomes), K.batch_cancelled (string: the
#: caller abandoned the batch; nothing more is appended).
BATCH = Lib(
    name="BATCH",
    keys=("batch_stream", "batch_cancelled"),
    source="""
local function batch_append(K, entry, ttl_s)
  if redis.call('EXISTS', K.batch_cancelled) == 1 then return end
  redis.call('XADD', K.batch_stream, '*', 'outcome', entry)
  redis.call('EXPIRE', K.batch_stream, ttl_s)
end
""",
)


def batch_keys(keys: Keys, batch_id: str | None) -> dict[str, str]:
    """The keys of :data:`BATCH` for one batch (a placeholder name for none)."""
    return {
        "batch_stream": keys.batch_results(batch_id or "-"),
        "batch_cancelled": keys.batch_cancelled(batch_id or "-"),
    }


class BatchStreams:
    """The caller's side of batch streams."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.r = db.redis
        self.keys = db.keys

    def read(
        self, batch_id: str, after: str, *, block_ms: int, count: int = 500
    ) -> list[tuple[str, dict[str, Any]]]:
        """Outcomes appended after entry ``after`` ("0-0": from the start), waiting up to
        ``block_ms`` for the first; each with its entry id."""
        key = self.keys.batch_results(batch_id)
        reply: Any = self._guarded(lambda: self.r.xread({key: after}, count=count, block=block_ms))
        return entries(reply)

    def trim(self, batch_id: str, upto: str) -> None:
        """Forget the entries up to ``upto`` (they were read)."""
        key = self.keys.batch_results(batch_id)
        self._guarded(lambda: self.r.xtrim(key, minid=upto))

    def cancelled(self, batch_id: str) -> bool:
        """Whether the batch was abandoned by its caller."""
        key = self.keys.batch_cancelled(batch_id)
        return bool(self._guarded(lambda: self.r.exists(key)))

    def abandon(self, batch_id: str, cancel: bool) -> None:
        """The caller left: cancel what was not submitted (``cancel``) and drop the stream."""
        k = self.keys
        pipe = self.r.pipeline(transaction=True)
        if cancel:
            pipe.set(k.batch_cancelled(batch_id), "1", ex=CANCEL_TTL)
        pipe.delete(k.batch_results(batch_id))
        self._guarded(pipe.execute)

    def _guarded(self, call: Callable[[], T]) -> T:
        return self.db.guard(call, "batch results are unavailable")


def entries(reply: Any) -> list[tuple[str, dict[str, Any]]]:
    """The (entry id, outcome) pairs of an ``XREAD`` reply of batch streams."""
    found: list[tuple[str, dict[str, Any]]] = []
    for _stream, items in reply or []:
        for entry_id, fields in items:
            outcome = fields.get("outcome", fields.get(b"outcome"))
            found.append((text(entry_id), json.loads(text(outcome))))
    return found

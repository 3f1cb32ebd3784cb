"""A solve's proxy and cookies, kept in Redis instead of task messages.

The caller's ``solve`` message carries them once; after that they wait here, under a key
with a TTL, for the submit that needs them (a parked, retried or resubmitted one), and
the completion deletes them (``lib/secrets.lua``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from .db import Db
from .keys import Keys

T = TypeVar("T")


def secrets_keys(keys: Keys, solve_id: str) -> dict[str, str]:
    """The keys of ``lib/secrets.lua`` for one solve."""
    return {"secrets": keys.request_secrets(solve_id)}


class RequestSecrets:
    def __init__(self, db: Db) -> None:
        self.db = db
        self.keys = db.keys

    def stash(self, solve_id: str, secrets: Mapping[str, Any], ttl_s: int) -> None:
        key = self.keys.request_secrets(solve_id)
        pipe = self.db.redis.pipeline(transaction=True)
        pipe.hset(key, mapping={k: json.dumps(v) for k, v in secrets.items()})
        pipe.expire(key, ttl_s)
        self._guarded(pipe.execute)

    def fetch(self, solve_id: str, names: Sequence[str]) -> dict[str, Any] | None:
        """The stashed values, or None when any of them is gone (expired)."""
        key, r = self.keys.request_secrets(solve_id), self.db.redis
        stored = self._guarded(lambda: r.hmget(key, list(names)))
        if any(v is None for v in stored):
            return None
        return {n: json.loads(str(v)) for n, v in zip(names, stored, strict=True)}

    def _guarded(self, call: Callable[[], T]) -> T:
        return self.db.guard(call, "solve secrets are unavailable")

"""A solve's proxy and cookies, kept in Redis instead of task messages.

The caller's ``solve`` message carries them once; after that they wait here, under a key
with a TTL, for the submit that needs them (a parked, retried or resubmitted one), and
the completion script deletes them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import redis

from ..keys import Keys
from .lua import guard

T = TypeVar("T")


class RequestSecrets:
    def __init__(self, r: redis.Redis, keys: Keys) -> None:
        self.r = r
        self.keys = keys

    def stash(self, solve_id: str, secrets: Mapping[str, Any], ttl_s: int) -> None:
        key = self.keys.request_secrets(solve_id)
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(key, mapping={k: json.dumps(v) for k, v in secrets.items()})
        pipe.expire(key, ttl_s)
        _guarded(pipe.execute)

    def fetch(self, solve_id: str, names: Sequence[str]) -> dict[str, Any] | None:
        """The stashed values, or None when any of them is gone (expired)."""
        key = self.keys.request_secrets(solve_id)
        stored = _guarded(lambda: self.r.hmget(key, list(names)))
        if any(v is None for v in stored):
            return None
        return {n: json.loads(str(v)) for n, v in zip(names, stored, strict=True)}


def _guarded(call: Callable[[], T]) -> T:
    return guard(call, "solve secrets are unavailable")

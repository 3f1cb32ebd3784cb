"""Tasks the tests chain to ``solve`` (a worker started with ``--include followups`` runs
them): each records what it was handed in a Redis list named by its tag."""

from __future__ import annotations

import json
import os
from typing import Any

import redis

from captcha_tasks import app


def _record(tag: str, value: Any) -> None:
    client = redis.Redis.from_url(os.environ["REDIS_URL"], decode_responses=True)
    try:
        client.rpush(f"followups:{tag}", json.dumps(value, default=repr))
    finally:
        client.close()


@app.task(name="tests.followups.record", shared=False)
def record(value: Any, tag: str) -> Any:
    """A ``link`` or the next task of a chain: records the value it was handed."""
    _record(tag, value)
    return value


@app.task(name="tests.followups.record_error", shared=False)
def record_error(request: Any, exc: BaseException, traceback: Any, tag: str) -> None:
    """A ``link_error``: records the error's type and code."""
    _record(tag, {"type": type(exc).__name__, "code": getattr(exc, "code", None)})


def recorded(client: Any, tag: str) -> list[Any]:
    return [json.loads(x) for x in client.lrange(f"followups:{tag}", 0, -1)]

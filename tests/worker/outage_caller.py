"""An app process for the tests of ``get()`` through a Redis outage: the caller's side, on
the Redis its environment names (the test's own server, which it stops and starts).

It reads one JSON command per line on stdin and answers each with one JSON line on stdout;
what it logs (WARNING and up: the backend saying Redis went away) comes as lines too, so
the test waits for what the caller says, not for a while:

* ``{"do": "send"}``: ``solve.delay(...)``, answered ``{"sent": task_id}``;
* ``{"do": "get", "id": ..., "timeout": s}``: ``AsyncResult(id).get(timeout=s)``;
* ``{"do": "aio", "timeout": s}``: ``await aio.solve(..., timeout=s)`` on the process's one
  event loop (kept for its life, so a second call finds the connections of the first).

Both calls are answered ``{"got": outcome, "ended": monotonic}`` or ``{"raised":
"module.Class", "message": ..., "s": seconds, "ended": monotonic}``.  Closing stdin ends it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
import time
from typing import Any

from celery.result import AsyncResult

from captcha_tasks import aio, solve
from captcha_tasks.worker.app import app

PAGE = "https://example.com/get-outage"
_out = threading.Lock()


def say(**line: Any) -> None:
    with _out:
        print(json.dumps(line, default=str), flush=True)


class Lines(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        say(log=record.getMessage(), logger=record.name)


def answer(call: Any) -> None:
    began = time.monotonic()
    try:
        outcome = call()
    except Exception as exc:  # every failure is a line for the test to judge
        kind = type(exc)
        say(
            raised=f"{kind.__module__}.{kind.__name__}",
            message=str(exc),
            s=time.monotonic() - began,
            ended=time.monotonic(),
        )
    else:
        say(got=outcome, s=time.monotonic() - began, ended=time.monotonic())


def main() -> None:
    handler = Lines(logging.WARNING)
    logging.getLogger().addHandler(handler)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    for raw in sys.stdin:
        command = json.loads(raw)
        if command["do"] == "send":
            sent = solve.delay(method="turnstile", sitekey="0x4AAAAAAAoutage", pageurl=PAGE)
            say(sent=sent.id)
        elif command["do"] == "get":
            result = AsyncResult(command["id"], app=app)
            answer(lambda r=result, t=command["timeout"]: r.get(timeout=t))
        elif command["do"] == "aio":
            call = aio.solve(
                method="turnstile",
                sitekey="0x4AAAAAAAoutage",
                pageurl=PAGE,
                timeout=command["timeout"],
            )
            # answered from a thread: the test talks to the process while the call waits
            future = asyncio.run_coroutine_threadsafe(call, loop)
            threading.Thread(target=answer, args=(future.result,), daemon=True).start()
    loop.call_soon_threadsafe(loop.stop)


if __name__ == "__main__":
    main()

"""A caller of captcha-tasks in a process of its own, for tests that stop and restart the
Redis it uses (this process's Celery app, broker included, is configured from its
environment): ``python batch_driver.py MODE COUNT``.

* ``sync`` / ``aio``: a batch of COUNT tasks through ``stream()`` / ``aio.stream``; each
  outcome is printed as a JSON line the moment it arrives.  With ``--leave-after K`` the
  caller reads a line from stdin after the K-th outcome, then leaves the loop;
  ``--timeout-per-task S`` is the batch's.
* ``solve``: COUNT concurrent ``await aio.solve()`` (a minute each at most); their outcomes
  are printed at the end.

Log records (INFO and above, any logger) go to stderr, one line each: the tests count them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

from captcha_tasks import aio
from captcha_tasks.batch import stream

PAGE = "https://example.com/driver"


def tasks(count: int) -> list[dict[str, Any]]:
    return [{"method": "turnstile", "sitekey": f"k{i}", "pageurl": PAGE} for i in range(count)]


def say(outcome: dict[str, Any]) -> None:
    print(json.dumps(outcome), flush=True)


def leaving(seen: int, leave_after: int | None) -> bool:
    if leave_after is None or seen < leave_after:
        return False
    sys.stdin.readline()  # the test is ready (it stopped Redis, say)
    return True


def run_sync(count: int, leave_after: int | None, timeout: float | None) -> None:
    results: Iterator[dict[str, Any]]
    with contextlib.closing(stream(tasks(count), timeout_per_task=timeout)) as results:
        for seen, outcome in enumerate(results, 1):
            say(outcome)
            if leaving(seen, leave_after):
                break


async def run_aio(count: int, leave_after: int | None, timeout: float | None) -> None:
    async with contextlib.aclosing(aio.stream(tasks(count), timeout_per_task=timeout)) as results:
        seen = 0
        async for outcome in results:
            seen += 1
            say(outcome)
            if leaving(seen, leave_after):
                break


async def run_solves(count: int) -> None:
    calls = (asyncio.wait_for(aio.solve(**task), 60) for task in tasks(count))
    for outcome in await asyncio.gather(*calls, return_exceptions=True):
        if isinstance(outcome, BaseException):
            say({"status": "raised", "error": type(outcome).__name__, "message": str(outcome)})
        else:
            say(outcome)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["sync", "aio", "solve"])
    parser.add_argument("count", type=int)
    parser.add_argument("--leave-after", type=int)
    parser.add_argument("--timeout-per-task", type=float)
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    if args.mode == "sync":
        run_sync(args.count, args.leave_after, args.timeout_per_task)
    elif args.mode == "aio":
        asyncio.run(run_aio(args.count, args.leave_after, args.timeout_per_task))
    else:
        asyncio.run(run_solves(args.count))


if __name__ == "__main__":
    main()

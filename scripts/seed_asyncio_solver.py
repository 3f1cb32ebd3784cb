#!/usr/bin/env python3
"""The peer in ``bench_batch``: a faithful re-implementation of the seed article's
streaming solver (asyncio + aiohttp, a semaphore of ``max_concurrent``, sleep-then-poll).

Only the base URL, the key and the sleep are parameters, so it can run against the
sandbox at one tenth of real time.  It prints one JSON line per result as it arrives.

    python scripts/seed_asyncio_solver.py --base-url URL --key KEY --count 200 --sleep 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp


async def submit_task(
    session: aiohttp.ClientSession, base: str, key: str, task: dict[str, Any]
) -> tuple[str | None, str | None]:
    params = {"key": key, "method": task.get("method", "userrecaptcha"), "json": 1}
    if params["method"] == "userrecaptcha":
        params["googlekey"] = task["sitekey"]
        params["pageurl"] = task["pageurl"]
    elif params["method"] == "turnstile":
        params["sitekey"] = task["sitekey"]
        params["pageurl"] = task["pageurl"]
    async with session.post(f"{base}/in.php", data=params) as resp:
        result = await resp.json(content_type=None)
        if result.get("status") != 1:
            return None, result.get("request", "unknown")
        return result["request"], None


async def poll_task(
    session: aiohttp.ClientSession,
    base: str,
    key: str,
    task_id: str,
    sleep: float,
    timeout: float = 300,
) -> tuple[str | None, str | None]:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        await asyncio.sleep(sleep)
        params = {"key": key, "action": "get", "id": task_id, "json": 1}
        async with session.get(f"{base}/res.php", params=params) as resp:
            result = await resp.json(content_type=None)
        if result.get("request") == "CAPCHA_NOT_READY":
            continue
        if result.get("status") == 1:
            return result["request"], None
        return None, result.get("request", "unknown")
    return None, "TIMEOUT"


async def solve_one(
    session: aiohttp.ClientSession,
    base: str,
    key: str,
    index: int,
    task: dict[str, Any],
    semaphore: asyncio.Semaphore,
    sleep: float,
) -> dict[str, Any]:
    async with semaphore:
        start = time.monotonic()
        task_id, error = await submit_task(session, base, key, task)
        if error:
            return {"index": index, "status": "failed", "error": error, "time": 0}
        token, error = await poll_task(session, base, key, str(task_id), sleep)
        elapsed = time.monotonic() - start
        if token:
            return {"index": index, "status": "solved", "token": token, "time": round(elapsed, 1)}
        return {"index": index, "status": "failed", "error": error, "time": round(elapsed, 1)}


async def stream_results(
    base: str, key: str, tasks: list[dict[str, Any]], max_concurrent: int, sleep: float
) -> AsyncIterator[dict[str, Any]]:
    semaphore = asyncio.Semaphore(max_concurrent)
    async with aiohttp.ClientSession() as session:
        pending = {
            asyncio.ensure_future(solve_one(session, base, key, i, t, semaphore, sleep))
            for i, t in enumerate(tasks)
        }
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                yield future.result()


async def main_async(args: argparse.Namespace) -> None:
    tasks = [
        {"method": "turnstile", "sitekey": "SITE_KEY", "pageurl": f"https://example.com/page{i}"}
        for i in range(args.count)
    ]
    async for result in stream_results(
        args.base_url, args.key, tasks, args.max_concurrent, args.sleep
    ):
        print(json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--max-concurrent", type=int, default=15)
    parser.add_argument("--sleep", type=float, default=5.0)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())

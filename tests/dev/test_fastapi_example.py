"""The FastAPI example (``examples/fastapi_app``) under uvicorn, driven over HTTP by
httpx's ``AsyncClient``, against a real worker, Redis and the sandbox."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from captcha_tasks.testing.processes import free_port, wait_until
from captcha_tasks.worker.app import app

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("worker", "clean_state")]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_app"
PAGE = "https://example.com/fastapi"


def task(**extra: Any) -> dict[str, Any]:
    return {"method": "turnstile", "sitekey": "0x4AAAAAAAfastapi", "pageurl": PAGE, **extra}


@pytest.fixture(scope="module")
def server(output_dir: Path, env: dict[str, str]) -> Iterator[str]:
    """``uvicorn fastapi_app:app`` from the example's folder; its base URL."""
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "fastapi_app:app", "--port", str(port)]
    log = output_dir / "fastapi-example.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, cwd=EXAMPLE, env=env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"uvicorn exited:\n{log.read_text()[-3000:]}")
        try:
            return httpx.get(f"{url}/openapi.json", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(up, 30, 0.1, "the FastAPI example")
        yield url
    finally:
        proc.terminate()
        proc.wait(15)


async def events(response: httpx.Response) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Server-sent events of a streaming response: (event name, JSON data)."""
    name, data = "message", ""
    async for line in response.aiter_lines():
        if line.startswith("event:"):
            name = line.partition(":")[2].strip()
        elif line.startswith("data:"):
            data += line.partition(":")[2].strip()
        elif not line and data:
            yield name, json.loads(data)
            name, data = "message", ""


def test_a_route_awaits_a_solve(server: str, sandbox: Any) -> None:
    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server, timeout=30) as client:
            return list(
                await asyncio.gather(*(client.post("/captchas", json=task()) for _ in range(5)))
            )

    replies = asyncio.run(main())
    assert [r.status_code for r in replies] == [200] * 5
    outcomes = [r.json() for r in replies]
    assert all(o["status"] == "solved" and o["method"] == "turnstile" for o in outcomes)
    assert len({o["token"] for o in outcomes}) == 5
    assert sandbox.verify(outcomes[0]["token"])["success"] is True


def test_bad_input_and_failed_solves_answer_their_errors(server: str, sandbox: Any) -> None:
    async def main() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=server, timeout=30) as client:
            bad = await client.post("/captchas", json=task(pageurl="ftp://x"))
            failed = await client.post("/captchas", json=task(proxy="u:p@bad-proxy.test:80"))
            return bad, failed

    bad, failed = asyncio.run(main())
    assert bad.status_code == 422
    assert bad.json()["error"] == "validation" and "pageurl" in bad.json()["message"]
    assert failed.status_code == 502
    assert failed.json()["error"] == "ERROR_PROXY_CONNECTION_FAILED"
    assert sandbox.stats()["submits"] == 1  # the bad request reached nobody


def test_a_batch_streams_as_server_sent_events(server: str, sandbox: Any) -> None:
    sandbox.configure(solve_time=0.8, jitter=0.6)
    n = 12
    tasks = [task(sitekey=f"k{i}") for i in range(n)]
    tasks[5] = task(method="nope")

    async def main() -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]:
        received: list[tuple[str, dict[str, Any]]] = []
        at_first: dict[str, Any] = {}
        async with (
            httpx.AsyncClient(base_url=server, timeout=60) as client,
            client.stream("POST", "/batches", json=tasks) as response,
        ):
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            async for name, data in events(response):
                if name == "result" and data["status"] == "solved" and not at_first:
                    at_first.update(sandbox.stats())
                received.append((name, data))
        return received, at_first

    received, at_first = asyncio.run(main())
    results = [data for name, data in received if name == "result"]
    assert received[-1] == ("done", {"solved": n - 1, "failed": 1})
    assert sorted(r["index"] for r in results) == list(range(n))
    assert next(r for r in results if r["index"] == 5)["error"] == "ERROR_VALIDATION"
    # streamed: the first solved result reached the client while others were being solved
    assert at_first["in_flight"] > 0, at_first


def test_a_client_that_leaves_cancels_the_batch(server: str, sandbox: Any, redis_conn: Any) -> None:
    capacity = app.runtime().state.limiter.config.capacity
    total = 8 * capacity
    sandbox.configure(threads=total, solve_time=0.8, jitter=0.3)

    async def main() -> dict[str, Any]:
        async with (
            httpx.AsyncClient(base_url=server, timeout=60) as client,
            client.stream("POST", "/batches", json=[task() for _ in range(total)]) as response,
        ):
            async for _name, data in events(response):
                return data  # leave after the first result: the connection closes
        raise AssertionError("no result")

    first = asyncio.run(main())
    assert first["status"] == "solved"

    def cancelled() -> list[str]:
        return list(redis_conn.scan_iter(app.runtime().state.keys.batch_cancelled("*")))

    wait_until(cancelled, 10, what="the batch to be cancelled")
    # How many were submitted by then depends on how fast this machine is; after it, only
    # captchas already holding a thread may be.
    at_cancel = sandbox.stats()["submits"]
    limiter = app.runtime().state.limiter
    wait_until(lambda: limiter.in_use() == 0, 15, what="in-flight captchas to finish")
    submitted = sandbox.stats()["submits"]
    assert submitted <= at_cancel + capacity, (submitted, at_cancel)
    assert limiter.parked_count() == 0
    wait_until(lambda: sandbox.stats()["in_flight"] == 0, 10, what="the provider to go idle")
    assert sandbox.stats()["submits"] == submitted

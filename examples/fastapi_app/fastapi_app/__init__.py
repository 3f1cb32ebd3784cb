"""A FastAPI app that solves captchas through captcha-tasks, without blocking its loop.

* ``POST /captchas`` awaits one solve (:func:`captcha_tasks.aio.solve`) and answers with
  its outcome.
* ``POST /batches`` starts a batch and streams each outcome to the client as a
  server-sent event as soon as a worker finishes it (:func:`captcha_tasks.aio.stream`).
  A client that goes away cancels what was not submitted yet.

Run it next to captcha-tasks' workers (one Redis, ``REDIS_URL``)::

    celery -A captcha_tasks worker -P threads -c 32 -l INFO
    uvicorn fastapi_app:app
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any

from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from kombu.exceptions import OperationalError
from starlette.types import Receive, Scope, Send

from captcha_tasks import aio
from captcha_tasks.errors import CaptchaTasksError, StoreUnavailable, ValidationError


@contextlib.asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    yield
    await aio.aclose()  # this loop's Redis connections


app = FastAPI(title="captcha-tasks FastAPI example", lifespan=lifespan)


@app.post("/captchas")
async def solve_captcha(params: Annotated[dict[str, Any], Body()]) -> JSONResponse:
    """Body: ``{"method": ..., "sitekey": ..., "pageurl": ..., **params}``; answers the
    outcome dict, or the error code of a failed solve."""
    try:
        outcome = await aio.solve(**params)
    except ValidationError as exc:
        return _error(422, "validation", str(exc))
    except (StoreUnavailable, OperationalError):
        return _error(503, "unavailable", "the task queue is unreachable")
    except CaptchaTasksError as exc:
        return _error(502, exc.code, str(exc))
    return JSONResponse(outcome)


@app.post("/batches")
async def solve_batch(tasks: Annotated[list[dict[str, Any]], Body()]) -> StreamingResponse:
    """Body: a JSON list of solve parameters.  Answers ``text/event-stream``: one ``result``
    event per task (the outcome with its ``index``), in completion order, then ``done``."""
    return ClosingStream(_events(tasks), media_type="text/event-stream")


class ClosingStream(StreamingResponse):
    """A streaming response that closes its generator however the response ends.  When
    the client leaves while an event is being sent, Starlette stops iterating but leaves
    the generator to the garbage collector, and the batch (and its bill) would go on
    until then."""

    def __init__(self, events: AsyncGenerator[str, None], **kwargs: Any) -> None:
        super().__init__(events, **kwargs)
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.events.aclose()


async def _events(tasks: list[dict[str, Any]]) -> AsyncGenerator[str, None]:
    counts = {"solved": 0, "failed": 0}
    # aclosing: a client that disconnects cancels the batch at once, not when collected.
    async with contextlib.aclosing(aio.stream(tasks)) as results:
        async for outcome in results:
            counts[outcome["status"]] += 1
            yield _event("result", outcome)
    yield _event("done", counts)


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status)

"""``captcha_tasks.aio`` end to end: real Redis, a real worker process and the sandbox,
each test body in its own event loop (``asyncio.run``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kombu.transport.redis import Channel

from captcha_tasks import aio, errors, report, solve
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker.app import app

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("worker", "clean_state")]

PAGE = "https://example.com/aio"
GET_TIMEOUT = 30


def task(**extra: Any) -> dict[str, Any]:
    return {"method": "turnstile", "sitekey": "0x4AAAAAAAaio", "pageurl": PAGE, **extra}


def aio_clients(redis_conn: Any) -> list[dict[str, Any]]:
    return [c for c in redis_conn.client_list() if c.get("name") == aio.CLIENT_NAME]


def test_await_solve_returns_what_get_returns(sandbox: Any) -> None:
    sync = solve.delay(**task(action="login")).get(timeout=GET_TIMEOUT)
    result = asyncio.run(aio.solve(**task(action="login")))
    assert result["status"] == "solved"
    assert list(result) == list(sync)  # the same fields, in the same order
    assert {k: type(v) for k, v in result.items()} == {k: type(v) for k, v in sync.items()}
    assert (result["method"], result["source"]) == (sync["method"], sync["source"])
    assert result["token"] != sync["token"]
    assert sandbox.verify(result["token"])["success"] is True


def test_await_report_reaches_the_provider_and_counts_for_the_site(sandbox: Any) -> None:
    outcome = asyncio.run(aio.solve(**task()))
    assert outcome["site"] == "example.com#0x4AAAAAAAaio"
    for score in (1.5, -0.1, True, "0.9"):  # checked at the call site, nothing sent
        with pytest.raises(errors.ValidationError, match="score must be a number"):
            asyncio.run(aio.report(outcome, good=True, score=score))  # type: ignore[arg-type]
        with pytest.raises(errors.ValidationError, match="score must be a number"):
            report(outcome, good=True, score=score)  # type: ignore[arg-type]
    asyncio.run(aio.report(outcome, good=False))
    wait_until(lambda: sandbox.stats()["reports_bad"] == 1, 10, what="the provider's report")
    counted = app.runtime().state.acceptance.read("turnstile", outcome["site"]).acceptance
    assert counted[outcome["provider"]].bad == pytest.approx(1, abs=0.01)
    assert sandbox.stats()["reports_good"] == 0


def test_failure_raises_the_same_typed_error(sandbox: Any) -> None:
    bad = task(proxy="u:p@bad-proxy.test:3128")
    with pytest.raises(errors.ProxyError) as sync:
        solve.delay(**bad).get(timeout=GET_TIMEOUT)
    with pytest.raises(errors.ProxyError) as info:
        asyncio.run(aio.solve(**bad))
    assert type(info.value) is type(sync.value)
    assert (info.value.code, info.value.message) == (sync.value.code, sync.value.message)
    assert info.value.captcha_id is None or info.value.captcha_id != sync.value.captcha_id


def housekeeping_keys() -> set[str]:
    """The keys a worker writes whatever the tests do: its housekeeping tick's, and the
    broker's record of a message it took (kombu's; a run saw them appear)."""
    state = app.runtime().state
    return {
        state.keys.redis_master(),
        state.keys.housekeeping_lock(),
        state.limiter.keys.threads_check_lock(),
        Channel.unacked_key,
        Channel.unacked_index_key,
        Channel.unacked_mutex_key,
    }


def test_bad_input_raises_at_the_call_site_and_queues_nothing(
    sandbox: Any, redis_conn: Any
) -> None:
    before = {q: redis_conn.llen(q) for q in app.runtime().settings.celery.queues}
    keys_before = set(redis_conn.scan_iter(count=1000))
    cases = [
        task(pageurl="javascript:alert(1)"),
        task(method="nope"),
        task(sitekey=None),
        task(colour="red"),
        {k: v for k, v in task().items() if k != "method"},
    ]
    for kwargs in cases:
        with pytest.raises(errors.ValidationError) as sync:
            solve.delay(**kwargs)
        with pytest.raises(errors.ValidationError) as info:
            asyncio.run(aio.solve(**kwargs))
        assert str(info.value) == str(sync.value)
    for timeout in (0, -1.5):  # aio's own argument, checked as early
        with pytest.raises(errors.ValidationError, match="timeout must be a number of seconds"):
            asyncio.run(aio.solve(**task(), timeout=timeout))
    assert {q: redis_conn.llen(q) for q in before} == before
    # nothing written: no new key (a key of an earlier test may expire meanwhile), but
    # the module's worker goes on meanwhile (a run saw its first tick, another its broker
    # record a message it took)
    assert set(redis_conn.scan_iter(count=1000)) - keys_before - housekeeping_keys() == set()
    assert sandbox.stats()["submits"] == 0


def test_many_concurrent_solves_share_one_connection_pool(sandbox: Any, redis_conn: Any) -> None:
    n = 300
    sandbox.configure(threads=n, solve_time=0.2, jitter=0.1)
    seen: dict[str, int] = {"clients": 0, "threads": 0}
    baseline = threading.active_count()

    async def watch(done: asyncio.Event) -> None:
        while not done.is_set():
            seen["clients"] = max(seen["clients"], len(aio_clients(redis_conn)))
            seen["threads"] = max(seen["threads"], threading.active_count())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.05)

    async def main() -> list[dict[str, Any]]:
        done = asyncio.Event()
        watcher = asyncio.create_task(watch(done))
        results = await asyncio.gather(*(aio.solve(**task(sitekey=f"k{i}")) for i in range(n)))
        done.set()
        await watcher
        return results

    results = asyncio.run(main())
    assert len(results) == n and all(r["status"] == "solved" for r in results)
    assert len({r["token"] for r in results}) == n
    # the pub/sub connection and at most one more for commands; no thread per call
    assert 1 <= seen["clients"] <= 2, seen
    assert seen["threads"] <= baseline + 1, (seen, baseline)
    # the loop's shutdown closed its connections
    wait_until(lambda: not aio_clients(redis_conn), 5, what="the asyncio connections to close")


def test_stream_yields_in_completion_order_with_failures_inline(sandbox: Any) -> None:
    sandbox.configure(solve_time=0.6, jitter=0.5)
    n = 20
    tasks = [task(sitekey=f"k{i}") for i in range(n)]
    tasks[3] = task(proxy="u:p@bad-proxy.test:3128")
    tasks[7] = task(pageurl="nope")

    async def source() -> AsyncIterator[dict[str, Any]]:
        for t in tasks:
            yield t

    async def main() -> list[dict[str, Any]]:
        return [r async for r in aio.stream(source(), window=8)]

    results = asyncio.run(main())
    order = [r["index"] for r in results]
    assert sorted(order) == list(range(n))
    assert order != list(range(n))
    by_index = {r["index"]: r for r in results}
    assert by_index[3]["error"] == "ERROR_PROXY_CONNECTION_FAILED"
    assert by_index[7]["error"] == "ERROR_VALIDATION"
    solved = [r for i, r in by_index.items() if i not in (3, 7)]
    assert all(r["status"] == "solved" for r in solved)
    assert len({r["token"] for r in solved}) == n - 2
    # at most a window was queued at a time
    assert sandbox.stats()["peak_in_flight"] <= 8


def test_a_result_that_never_comes_times_out(sandbox: Any) -> None:
    sandbox.configure(solve_time=4, jitter=0)

    async def main() -> list[dict[str, Any]]:
        return [r async for r in aio.stream([task(), task()], timeout_per_task=1.0)]

    results = asyncio.run(asyncio.wait_for(main(), 3.5))
    assert sorted(r["index"] for r in results) == [0, 1]
    assert {r["error"] for r in results} == {"ERROR_SOLVE_TIMEOUT"}
    # the shared sandbox is left idle for the next test, and so is the worker: a solve the
    # stream stopped waiting for goes on until a poll fetches its answer, and each "not
    # ready" renews its thread's lease; one still polling when the next test held the
    # sandbox's answers kept a thread of that test's (a run saw 14 of its 15 submitted)
    wait_until(lambda: sandbox.stats()["in_flight"] == 0, 10, what="the provider to go idle")
    limiter = app.runtime().state.limiter
    wait_until(lambda: limiter.in_use() == 0, 15, what="the worker to fetch both answers")


# Leaving with break: tests/app/test_batch_drivers.py, for both drivers.
def test_leaving_the_stream_cancels_what_was_not_submitted(sandbox: Any, redis_conn: Any) -> None:
    capacity = app.runtime().state.limiter.config.capacity
    total = 4 * capacity
    # Behind the latch no answer comes and no thread frees: the first `capacity` captchas
    # are submitted, the rest wait for a thread, whatever this machine's speed.
    sandbox.configure(threads=total, solve_time=0.8, jitter=0.3, hold=True)
    limiter = app.runtime().state.limiter

    async def consume() -> None:
        async for _ in aio.stream([task() for _ in range(total)], window=total):
            pass

    def cancelled() -> list[str]:
        return list(redis_conn.scan_iter(app.runtime().state.keys.batch_cancelled("*")))

    def every_thread_taken_and_more_waiting() -> bool:
        return sandbox.stats()["submits"] == capacity and limiter.parked_count() > 0

    def threads_and_waits() -> str:
        submits, parked = sandbox.stats()["submits"], limiter.parked_count()
        return f"{capacity} submits and some parked (saw {submits} submits, {parked} parked)"

    async def main() -> None:
        consumer = asyncio.create_task(consume())
        await _until(every_thread_taken_and_more_waiting, 15, threads_and_waits)
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        await _until(cancelled, 5, "the batch's cancellation")

    asyncio.run(main())
    sandbox.configure(hold=False)
    wait_until(lambda: limiter.in_use() == 0, 15, what="in-flight captchas to finish")
    # none of the captchas that were waiting for a thread was submitted after the cancel
    assert sandbox.stats()["submits"] == capacity
    assert limiter.parked_count() == 0
    assert len(cancelled()) == 1
    wait_until(lambda: sandbox.stats()["in_flight"] == 0, 10, what="the provider to go idle")
    assert sandbox.stats()["submits"] == capacity


def test_a_cancel_scope_that_cancels_the_cleanup_too_still_cancels_the_batch(
    sandbox: Any, redis_conn: Any
) -> None:
    """anyio's cancel scope (Starlette's, when a client leaves a streaming response) cancels
    every await of the cancelled task's cleanup as well, the batch's cancellation among
    them: it is shielded."""
    import anyio

    capacity = app.runtime().state.limiter.config.capacity
    total = 4 * capacity
    sandbox.configure(threads=total, solve_time=0.8, jitter=0.3, hold=True)
    limiter = app.runtime().state.limiter

    def cancelled() -> list[str]:
        return list(redis_conn.scan_iter(app.runtime().state.keys.batch_cancelled("*")))

    def every_thread_taken_and_more_waiting() -> bool:
        return sandbox.stats()["submits"] == capacity and limiter.parked_count() > 0

    def threads_and_waits() -> str:
        submits, parked = sandbox.stats()["submits"], limiter.parked_count()
        return f"{capacity} submits and some parked (saw {submits} submits, {parked} parked)"

    async def consume(scope: anyio.CancelScope) -> None:
        with scope:
            async with contextlib.aclosing(aio.stream([task() for _ in range(total)])) as out:
                async for _ in out:
                    pass

    async def main() -> None:
        scope = anyio.CancelScope()
        async with anyio.create_task_group() as group:
            group.start_soon(consume, scope)
            await _until(every_thread_taken_and_more_waiting, 15, threads_and_waits)
            scope.cancel()
        await _until(cancelled, 5, "the batch's cancellation")

    asyncio.run(main())
    sandbox.configure(hold=False)
    wait_until(lambda: limiter.in_use() == 0, 15, what="in-flight captchas to finish")
    assert sandbox.stats()["submits"] == capacity
    assert limiter.parked_count() == 0
    wait_until(lambda: sandbox.stats()["in_flight"] == 0, 10, what="the provider to go idle")


async def _until(
    predicate: Callable[[], object], seconds: float, what: str | Callable[[], str]
) -> None:
    """Poll a condition until a deadline, off the event loop: its Redis and HTTP calls
    block, and on the loop they would starve the stream under test of its turns."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not await asyncio.to_thread(predicate):
        if loop.time() > deadline:
            seen = what() if callable(what) else what
            raise AssertionError(f"not within {seconds} s: {seen}")
        await asyncio.sleep(0.01)  # a poll of a condition with a deadline


def test_waits_survive_a_lost_pubsub_connection(sandbox: Any, redis_conn: Any) -> None:
    n = 20
    # Behind the latch no answer comes before every wait has subscribed and the connection
    # is killed, whatever this machine's speed (a solve that ended first unsubscribed, and
    # the count of 20 was never reached on a loaded run).
    sandbox.configure(threads=n, solve_time=1.0, jitter=0.2, hold=True)

    def subscribers() -> list[dict[str, Any]]:
        return [c for c in aio_clients(redis_conn) if int(c.get("sub", 0)) > 0]

    async def main() -> list[dict[str, Any]]:
        calls = asyncio.gather(*(aio.solve(**task(sitekey=f"k{i}")) for i in range(n)))
        await _until(
            lambda: sum(int(c["sub"]) for c in subscribers()) >= n, 10, f"{n} subscriptions"
        )
        killed = redis_conn.client_kill_filter(_type="pubsub")
        assert killed >= 1
        sandbox.configure(hold=False)
        return list(await asyncio.wait_for(calls, 30))

    results = asyncio.run(main())
    assert len(results) == n and all(r["status"] == "solved" for r in results)


def test_only_a_ready_record_ends_the_wait(redis_conn: Any) -> None:
    """In-flight states (a custom PARKED, STARTED) are published and stored on the result
    key too: a wait ends on SUCCESS, FAILURE or REVOKED only, whether the record was
    published or stored before the subscription."""
    backend = app.backend

    def record(task_id: str, status: str, result: Any) -> str:
        meta = {"status": status, "result": result, "traceback": None, "children": []}
        return str(backend.encode({**meta, "task_id": task_id, "date_done": None}))

    published, stored = str(uuid.uuid4()), str(uuid.uuid4())
    done = {"status": "solved", "token": "t"}

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        hub = aio._hubs().hub()
        key = aio._result_key(published)
        waiting = asyncio.create_task(hub.wait_result(key))
        await _until(lambda: redis_conn.pubsub_numsub(key)[0][1] == 1, 5, "a subscriber")
        for status, result in (("PARKED", {"at": "limiter"}), ("STARTED", None)):
            redis_conn.publish(key, record(published, status, result))
        redis_conn.publish(key, record(published, "SUCCESS", done))  # the channel keeps order
        first = aio._outcome(await asyncio.wait_for(waiting, 5))
        # stored before anyone listened: an in-flight record is not an answer...
        key = aio._result_key(stored)
        redis_conn.set(key, record(stored, "SUBMITTED", {"captcha_id": "7"}))
        waiting = asyncio.create_task(hub.wait_result(key))
        await _until(lambda: redis_conn.pubsub_numsub(key)[0][1] == 1, 5, "a subscriber")
        await _until(lambda: hub.rereader and hub.rereader.done(), 5, "the re-read")
        assert not waiting.done()  # it read SUBMITTED, and goes on waiting
        redis_conn.set(key, record(stored, "SUCCESS", {**done, "token": "u"}))  # no publish
        assert redis_conn.client_kill_filter(_type="pubsub") >= 1  # subscribed again: re-read
        second = await asyncio.wait_for(waiting, 10)
        return first, aio._outcome(second)

    first, second = asyncio.run(main())
    assert first == done
    assert second == {**done, "token": "u"}


def test_at_its_timeout_a_wait_asks_redis_why(redis_conn: Any) -> None:
    """At the timeout the wait looks at the record once more, whatever the reader last
    thought of the channel: a ready record stored without a publication reaching the wait
    is its answer, and with Redis answering and no record the timeout is asyncio's, even
    while the reader still holds an outage it met (a CI run got ``StoreUnavailable`` for
    a wait that began after Redis was back)."""
    backend = app.backend
    stored, missing = str(uuid.uuid4()), str(uuid.uuid4())
    meta = {"status": "SUCCESS", "result": {"status": "solved", "token": "v"}}
    ready = str(backend.encode({**meta, "traceback": None, "children": [], "task_id": stored}))

    async def main() -> tuple[dict[str, Any], BaseException]:
        hub = aio._hubs().hub()
        key = aio._result_key(stored)
        waiting = asyncio.create_task(hub.wait_result(key, timeout=3.0))
        await _until(lambda: redis_conn.pubsub_numsub(key)[0][1] == 1, 5, "a subscriber")
        await _until(lambda: hub.rereader and hub.rereader.done(), 5, "the re-read")
        redis_conn.set(key, ready)  # stored, never published: only the last look finds it
        found = aio._outcome(await asyncio.wait_for(waiting, 10))
        hub.lost, hub.lost_error = True, ConnectionError("an outage the reader met")
        with pytest.raises(TimeoutError) as timed_out:
            await hub.wait_result(aio._result_key(missing), timeout=0.5)
        return found, timed_out.value

    found, timed_out = asyncio.run(main())
    assert found == meta["result"]
    assert type(timed_out) is TimeoutError and "no outcome within 0.5 s" in str(timed_out)


#: What asyncio's streams raise when a second coroutine reads a connection one is reading:
#: redis-py's reconnects of the shared pub/sub connection can make it happen.
CLASH = "readuntil() called while another coroutine is already waiting for incoming data"


def _ready_record(task_id: str, token: str) -> tuple[dict[str, Any], str]:
    meta = {"status": "SUCCESS", "result": {"status": "solved", "token": token}}
    record = {**meta, "traceback": None, "children": [], "task_id": task_id}
    return meta["result"], str(app.backend.encode(record))


def _published_until_answered(redis_conn: Any, key: str, record: str, waiting: Any) -> bool:
    """Publish ``record`` (never stored: only a publication can answer the wait) and say
    whether the wait has its answer."""
    redis_conn.publish(key, record)
    return bool(waiting.done())


def test_an_error_on_the_result_channel_costs_it_its_connection_not_its_waits(
    redis_conn: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever the pub/sub connection raises, the reader replaces it, subscribed to the
    channels waited on, and the waits go on.  An error it did not expect (a CI run:
    ``RuntimeError`` from two coroutines reading it at once) used to end the reader, and
    every wait on its loop failed as "closed"."""
    caplog.set_level(logging.WARNING, logger="captcha_tasks.aio")
    task_id = str(uuid.uuid4())
    outcome, record = _ready_record(task_id, "w")

    async def main() -> dict[str, Any]:
        hub = aio._hubs().hub()
        first = hub.pubsub
        real_read = first.get_message

        async def clashing(*args: Any, **kwargs: Any) -> Any:
            first.get_message = real_read  # type: ignore[method-assign]
            raise RuntimeError(CLASH)

        first.get_message = clashing  # type: ignore[method-assign]
        key = aio._result_key(task_id)
        waiting = asyncio.create_task(hub.wait_result(key, timeout=20))
        await _until(lambda: hub.pubsub is not first and not hub.stale, 10, "a new connection")
        await _until(
            lambda: _published_until_answered(redis_conn, key, record, waiting), 10, "the answer"
        )
        return aio._outcome(await waiting)

    assert asyncio.run(main()) == outcome
    lost = [r for r in caplog.records if r.getMessage().startswith("result channel lost")]
    assert [r.getMessage() for r in lost] == [
        f"result channel lost (RuntimeError: {CLASH}); reconnecting"
    ]
    assert lost[0].exc_info is not None  # one it did not expect: with its traceback


def test_a_subscribe_that_meets_an_error_tries_again(redis_conn: Any) -> None:
    """A wait's SUBSCRIBE that meets the same error backs off and tries again, as it does
    while Redis is away, rather than handing the caller a redis-py error."""
    task_id = str(uuid.uuid4())
    outcome, record = _ready_record(task_id, "s")
    tried: list[tuple[str, ...]] = []

    async def main() -> dict[str, Any]:
        hub = aio._hubs().hub()
        real_subscribe = hub.pubsub.subscribe

        async def clashing_once(*channels: str) -> Any:
            tried.append(channels)
            if len(tried) == 1:
                raise RuntimeError(CLASH)
            return await real_subscribe(*channels)

        hub.pubsub.subscribe = clashing_once  # type: ignore[method-assign]
        key = aio._result_key(task_id)
        waiting = asyncio.create_task(hub.wait_result(key, timeout=20))
        await _until(
            lambda: _published_until_answered(redis_conn, key, record, waiting), 10, "the answer"
        )
        return aio._outcome(await waiting)

    assert asyncio.run(main()) == outcome
    assert len(tried) == 2

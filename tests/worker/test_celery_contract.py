"""``solve`` behaves as a Celery task should: its record is Celery's own, what is chained to it
(chain, link, link_error, chord, group) gets the outcome when the solve ends, revoke and
``expires`` are honoured up to the moment of submission, and while in flight its state says
where it is.  Real worker processes, the sandbox over HTTP, real Redis."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import chain, chord, group, states
from celery.exceptions import ChordError, TaskRevokedError
from celery.result import AsyncResult
from followups import record, record_error, recorded

from captcha_tasks import aio, create_pool, errors, solve
from captcha_tasks.batch import publish
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker.app import app
from captcha_tasks.worker.results import PARKED, SUBMITTED, Results
from captcha_tasks.worker.tasks import prewarm

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("clean_state")]

PAGE = "https://example.com/contract"
TESTS = str(Path(__file__).resolve().parent)


def task(sitekey: str = "k", **extra: Any) -> dict[str, Any]:
    return {"method": "turnstile", "sitekey": sitekey, "pageurl": PAGE, **extra}


@pytest.fixture
def workers(start_worker: Any, env: dict[str, str]) -> Any:
    """A worker that also runs the follow-up tasks (tests/worker/followups.py)."""

    def start(**extra: str) -> Any:
        path = ":".join(p for p in (TESTS, env.get("PYTHONPATH")) if p)
        return start_worker(
            {"PYTHONPATH": path, **extra}, extra_args=("--include", "followups"), name="contract"
        )

    return start


# -- the record -------------------------------------------------------------------------------


def test_records_read_as_celery_reads_them(redis_conn: Any) -> None:
    results = Results(app)
    outcome = {"status": "solved", "token": "t", "captcha_id": "7"}
    error = errors.ProxyError("bad proxy", "ERROR_BAD_PROXY", "7")
    cases: list[tuple[str, str, Any]] = [
        ("contract-ok", states.SUCCESS, outcome),
        ("contract-failed", states.FAILURE, error),
        ("contract-revoked", states.REVOKED, TaskRevokedError("revoked")),
        ("contract-submitted", SUBMITTED, {"captcha_id": "7", "attempt": 0}),
    ]
    for task_id, state, value in cases:
        redis_conn.set(results.key(task_id), results.record(task_id, state, value))
    ok = AsyncResult("contract-ok", app=app)
    assert (ok.state, ok.get(timeout=1)) == (states.SUCCESS, outcome)
    assert app.backend.get_task_meta("contract-ok")["date_done"]
    failed = AsyncResult("contract-failed", app=app)
    with pytest.raises(errors.ProxyError) as raised:
        failed.get(timeout=1)
    assert (raised.value.code, raised.value.captcha_id) == ("ERROR_BAD_PROXY", "7")
    with pytest.raises(TaskRevokedError):
        AsyncResult("contract-revoked", app=app).get(timeout=1)
    submitted = AsyncResult("contract-submitted", app=app)
    assert (submitted.state, submitted.info) == (SUBMITTED, {"captcha_id": "7", "attempt": 0})
    assert not submitted.ready()
    # the readers: ready states only end a wait; outcome dicts for batches and Kafka
    read = results.read(redis_conn.get(results.key("contract-submitted")))
    assert not read.ready
    revoked = results.read(redis_conn.get(results.key("contract-revoked")))
    assert revoked.outcome_dict("turnstile")["error"] == "ERROR_REVOKED"


# -- what is chained to a solve ----------------------------------------------------------------


def test_chain_link_and_link_error_get_the_outcome(
    sandbox: Any, workers: Any, redis_conn: Any
) -> None:
    workers()
    chained = chain(solve.s(**task("chain")), record.s("chain")).apply_async()
    assert chained.get(timeout=30)["status"] == "solved"
    [handed] = recorded(redis_conn, "chain")
    assert handed["status"] == "solved" and sandbox.verify(handed["token"])["success"]

    linked = solve.apply_async(kwargs=task("link"), link=record.s("link"))
    outcome = linked.get(timeout=30)
    wait_until(lambda: recorded(redis_conn, "link"), 10, what="the linked task")
    assert recorded(redis_conn, "link") == [outcome]

    bad = solve.apply_async(
        kwargs=task("error", proxy="u:p@bad-proxy.test:80"),
        link=record.s("never"),
        link_error=record_error.s("error"),
    )
    with pytest.raises(errors.ProxyError) as raised:
        bad.get(timeout=30)
    wait_until(lambda: recorded(redis_conn, "error"), 10, what="the error callback")
    assert recorded(redis_conn, "error") == [{"type": "ProxyError", "code": raised.value.code}]
    assert recorded(redis_conn, "never") == []

    # a chain after a failed solve fails too (its caller is not left waiting)
    broken = chain(solve.s(**task("broken", proxy="u:p@bad-proxy.test:80")), record.s("x"))
    with pytest.raises(errors.ProxyError):
        broken.apply_async().get(timeout=30)


def test_linked_tasks_run_once_and_are_the_solves_children_as_in_plain_celery(
    sandbox: Any, workers: Any, redis_conn: Any
) -> None:
    workers()
    # Plain Celery: a task with link= lists the linked task as its child.
    plain = record.apply_async(({"plain": True}, "plain"), link=record.s("plain-child"))
    [plain_child] = _children(plain)
    assert plain_child.get(timeout=10) == plain.get(timeout=10)

    linked = solve.apply_async(kwargs=task("children"), link=record.s("solve-child"))
    outcome = linked.get(timeout=30)
    [child] = _children(linked)
    assert type(child) is type(plain_child) and child.parent == plain_child.parent is None
    assert child.get(timeout=10) == outcome
    # the linked task ran once, with the outcome (never with the solve message's return)
    assert recorded(redis_conn, "solve-child") == [outcome]
    assert AsyncResult(linked.id, app=app).children == [child]

    # a chain's next task is the solve's child too, as in a plain chain
    chained = chain(solve.s(**task("chained")), record.s("chain-child")).apply_async()
    assert chained.get(timeout=30)["status"] == "solved"
    assert _children(chained.parent) == [chained]
    assert len(recorded(redis_conn, "chain-child")) == 1


def _children(result: AsyncResult) -> list[Any]:
    """``result``'s children, once its record is stored (its own get() waits for that)."""
    result.get(timeout=30)
    return list(AsyncResult(result.id, app=app).children or [])


def test_a_chord_of_parked_pooled_and_resubmitted_solves(
    sandbox: Any, workers: Any, redis_conn: Any
) -> None:
    sandbox.configure(threads=1, solve_time=0.5, jitter=0.1)
    workers(CAPTCHAAI_THREADS="1", CAPTCHAAI_POOL_RESERVE="0", CAPTCHAAI_MAX_RESUBMITS="8")
    create_pool("chord-pool", "turnstile", "pooled", PAGE, size=1, ttl=200)
    prewarm.delay("chord-pool").get(timeout=30)
    wait_until(lambda: app.runtime().state.pools.live("chord-pool") >= 1, 30, what="the pool")
    sandbox.configure(unsolvable_rate=1.0, seed=3)  # every new captcha is unsolvable at first
    members = [
        solve.s(**task("pooled")),  # answered from the pool
        solve.s(**task("parked-a")),  # waits for the one thread...
        solve.s(**task("parked-b")),
    ]
    result = chord(members)(record.s("chord"))
    # A captcha came back unsolvable and was submitted again: then let captchas be solvable.
    wait_until(lambda: sandbox.stats()["unsolvable_created"] >= 2, 30, what="a resubmit")
    sandbox.configure(unsolvable_rate=0.0)
    outcomes = result.get(timeout=60)
    assert [o["status"] for o in outcomes] == ["solved"] * 3
    assert outcomes[0]["source"] == "pool"
    [handed] = recorded(redis_conn, "chord")
    assert handed == outcomes
    assert sandbox.stats()["submits"] > 2  # the parked ones were resubmitted at least once


def test_a_group_of_solves_still_works(sandbox: Any, workers: Any) -> None:
    workers()
    outcomes = group(solve.s(**task(f"g{i}")) for i in range(3)).apply_async().get(timeout=30)
    assert [o["status"] for o in outcomes] == ["solved"] * 3


def test_sends_read_elsewhere_leave_celerys_result_subscription_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch's sends and the asyncio API's (their outcomes come by the batch's stream and
    the hub's own pub/sub) do not subscribe Celery's result consumer, so the ``AsyncResult``
    they leave behind has nothing to unsubscribe when it is collected (Celery does that in
    ``__del__``, where a Ctrl-C is swallowed); ``solve.delay`` still subscribes."""
    consumer = app.backend.result_consumer
    consumed: list[str] = []
    subscribe = consumer.consume_from  # Celery: what on_task_call subscribes with

    def watching(task_id: str) -> Any:
        consumed.append(task_id)
        return subscribe(task_id)

    monkeypatch.setattr(consumer, "consume_from", watching)
    try:
        aio._send_solve(task("aio-unwatched"))
        publish(str(uuid.uuid4()), task("batch-unwatched"))
        watched = solve.delay(**task("watched"))
        assert consumed == [watched.id]
    finally:
        app.control.purge()  # no worker ran them: none is left for the next test's


# -- revoke, expires and the states in flight -------------------------------------------------


#: The method of the revoke test's captchas alone in this module: the sandbox counts what it
#: accepted by method, so a captcha an earlier test left behind is not counted as its.
REVOKE_METHOD = "userrecaptcha"


def paid(sandbox: Any) -> int:
    """The revoke test's captchas the sandbox accepted (the provider charged for)."""
    return int(sandbox.stats()["submits_by_method"].get(REVOKE_METHOD, 0))


def test_revoked_and_expired_parked_solves_cost_no_submit(sandbox: Any, workers: Any) -> None:
    # The scenario has 3 s solves; 6 s here, so that the revokes below land while
    # the two running solves still hold both threads even on a loaded machine (a thread
    # freed before them would rightly go to a parked solve not revoked yet).
    # Both of the sandbox's threads free first: a captcha of an earlier test still being
    # solved there would refuse a running solve (NO_SLOT) and shift every thread it frees.
    wait_until(lambda: sandbox.stats()["in_flight"] == 0, 30, what="the sandbox idle")
    sandbox.configure(threads=2, solve_time=6.0, jitter=0.0)
    workers(CAPTCHAAI_THREADS="2", CAPTCHAAI_POOL_RESERVE="0")

    def one(name: str) -> dict[str, Any]:
        return task(name, method=REVOKE_METHOD)

    running = [solve.delay(**one(f"run{i}")) for i in range(2)]
    wait_until(lambda: paid(sandbox) == 2, 10, what="two threads busy")
    parked = [solve.delay(**one(f"park{i}")) for i in range(4)]
    expiring = solve.apply_async(kwargs=one("expiring"), expires=2)
    waiting = [solve.delay(**one(f"wait{i}")) for i in range(2)]
    wait_until(
        lambda: all(r.state == PARKED for r in [*parked, *waiting]), 20, what="parked solves"
    )
    for r in parked:
        r.revoke()
    assert paid(sandbox) == 2, "a thread freed before the revokes were sent"
    for r in parked:
        with pytest.raises(TaskRevokedError):
            r.get(timeout=30)
    with pytest.raises(TaskRevokedError):
        expiring.get(timeout=30)
    assert all(r.get(timeout=30)["status"] == "solved" for r in [*running, *waiting])
    assert paid(sandbox) == 4  # the two running and the two left, nothing else
    wait_until(lambda: app.runtime().state.limiter.in_use() == 0, 10, what="threads freed")


def test_a_solve_revoked_at_the_provider_is_discarded_when_it_ends(
    sandbox: Any, workers: Any
) -> None:
    sandbox.configure(solve_time=1.5, jitter=0.0)
    workers()
    result = solve.delay(**task("at-provider"))
    wait_until(lambda: result.state == SUBMITTED, 10, what="the captcha at the provider")
    assert result.info["captcha_id"]
    result.revoke()
    with pytest.raises(TaskRevokedError):
        result.get(timeout=30)
    assert sandbox.stats()["submits"] == 1
    wait_until(lambda: app.runtime().state.limiter.in_use() == 0, 10, what="its thread freed")


def test_a_solve_message_that_expired_before_it_ran_ends(
    sandbox: Any, workers: Any, redis_conn: Any
) -> None:
    workers()
    past = datetime.now(UTC) - timedelta(seconds=1)
    late = solve.apply_async(kwargs=task("late"), expires=past)
    with pytest.raises(TaskRevokedError):
        late.get(timeout=30)
    requested = app.runtime().state.keys.requested()
    wait_until(lambda: redis_conn.zscore(requested, late.id) is None, 10, what="not awaited")
    assert sandbox.stats()["submits"] == 0

    # a chord counts such a part: the chord ends, its body failed as after any revoked
    # part (the caller's get() raises the part's own error)
    parts = [solve.s(**task("late-part")).set(expires=past), solve.s(**task("on-time"))]
    body = chord(parts)(record.s("late-chord"))
    wait_until(lambda: body.state == states.FAILURE, 30, what="the chord's body failed")
    assert isinstance(body.result, ChordError)
    assert recorded(redis_conn, "late-chord") == []

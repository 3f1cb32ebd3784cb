"""Canvas onto the caller's own tasks: a second Celery app, as the Django and Flask guides
set one up (its own queue, its own worker, nothing of captcha_tasks in its routes), whose
task follows ``solve`` as the next task of a ``chain``, a ``link``, a ``link_error`` and a
``chord``'s body.  The captcha worker (a real process) sends each; it must reach the
app's own worker (Celery's in-process test worker: a separate process is not the point
here), never the captcha worker (``Received unregistered task``), with no
``.set(queue=...)``."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, chain, chord
from celery import _state as celery_state
from celery.contrib.testing.worker import start_worker

from captcha_tasks import errors, solve
from captcha_tasks.testing.processes import CeleryProcess, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("clean_state")]

PAGE = "https://example.com/user-canvas"


def task(sitekey: str, **extra: Any) -> dict[str, Any]:
    return {"method": "turnstile", "sitekey": sitekey, "pageurl": PAGE, **extra}


@pytest.fixture(scope="module")
def myapp(redis_url: str, isolated_module: str) -> Iterator[Celery]:
    """The user's app: the same Redis, a queue of its own, and an in-process worker."""
    user = Celery("myapp", broker=redis_url, backend=redis_url, set_as_current=False)
    queue = f"{isolated_module}-myq"
    user.conf.update(
        task_default_queue=queue,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
    )

    def record(tag: str, value: Any) -> None:
        with user.backend.client.pipeline() as pipe:
            pipe.rpush(f"{isolated_module}:myapp:{tag}", json.dumps(value)).execute()

    @user.task(name="myapp.use_token")
    def use_token(outcome: dict[str, Any]) -> dict[str, Any]:
        record("used", outcome["token"])
        return {"used": outcome["token"]}

    @user.task(name="myapp.use_tokens")
    def use_tokens(outcomes: list[dict[str, Any]]) -> list[str]:
        return sorted(o["token"] for o in outcomes)

    @user.task(name="myapp.on_error")
    def on_error(task_id: str) -> None:
        # Sent by a worker that does not know this task: Celery hands it the failed task's
        # id, and the typed error is that task's result.
        failed = user.AsyncResult(task_id)
        record("error", {"type": type(failed.result).__name__, "code": failed.result.code})

    # Celery's test worker sets the process up as a worker would: its app becomes the
    # current and default one, and the root logger is configured at its log level (ERROR:
    # later modules in this process then never hear a warning).  All put back after.
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    current, default = celery_state.get_current_app(), celery_state.default_app
    try:
        with start_worker(
            user, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=10
        ):
            yield user
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers
        current.set_current()
        celery_state.set_default_app(default)


@pytest.fixture
def recorded(myapp: Celery, redis_conn: Any, isolated_module: str) -> Any:
    def read(tag: str) -> list[Any]:
        key = f"{isolated_module}:myapp:{tag}"
        return [json.loads(x) for x in redis_conn.lrange(key, 0, -1)]

    yield read
    for tag in ("used", "error"):
        redis_conn.delete(f"{isolated_module}:myapp:{tag}")


def unregistered(worker: CeleryProcess) -> list[str]:
    return [line for line in worker.log_text().splitlines() if "unregistered task" in line]


def test_a_chain_onto_the_callers_task(myapp: Celery, worker: CeleryProcess) -> None:
    use_token = myapp.tasks["myapp.use_token"]
    result = chain(solve.s(**task("chain")), use_token.s()).delay()
    got = result.get(timeout=30)
    assert got == {"used": result.parent.get(timeout=5)["token"]}
    assert unregistered(worker) == []


def test_a_link_and_a_link_error_onto_the_callers_tasks(
    myapp: Celery, worker: CeleryProcess, recorded: Any
) -> None:
    ok = solve.apply_async(kwargs=task("link"), link=myapp.tasks["myapp.use_token"].s())
    outcome = ok.get(timeout=30)
    wait_until(lambda: recorded("used"), 20, what="the link on the caller's worker")
    assert recorded("used") == [outcome["token"]]

    bad = solve.apply_async(
        kwargs=task("error", proxy="u:p@bad-proxy.test:80"),
        link_error=myapp.tasks["myapp.on_error"].s(),
    )
    with pytest.raises(errors.ProxyError) as raised:
        bad.get(timeout=30)
    wait_until(lambda: recorded("error"), 20, what="the errback on the caller's worker")
    assert recorded("error") == [{"type": "ProxyError", "code": raised.value.code}]
    assert unregistered(worker) == []


def test_a_chord_with_the_callers_task_as_its_body(myapp: Celery, worker: CeleryProcess) -> None:
    body = myapp.tasks["myapp.use_tokens"].s()
    result = chord([solve.s(**task(f"chord{i}")) for i in range(3)], body).delay()
    tokens = result.get(timeout=40)
    assert len(tokens) == 3 and all(isinstance(t, str) and t for t in tokens)
    assert unregistered(worker) == []


def test_a_follow_up_the_caller_routed_itself_keeps_its_route(
    myapp: Celery, worker: CeleryProcess
) -> None:
    use_token = myapp.tasks["myapp.use_token"]
    queue = myapp.conf.task_default_queue  # set by hand: the same queue, named explicitly
    result = chain(solve.s(**task("routed")), use_token.s().set(queue=queue)).delay()
    assert "used" in result.get(timeout=30)

"""A solve or submit that retries through an outage of the Redis that is also the broker
keeps its message: Celery's own retry drops it when the retry cannot be published."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, Task
from celery.exceptions import Reject

from captcha_tasks.errors import StoreUnavailable
from captcha_tasks.testing.processes import free_port
from captcha_tasks.worker.celery_compat.messages import OutageTask
from captcha_tasks.worker.tasks import solve, submit

# A real broker that is down: nothing listens on the port (a socket, so the redis tier).
pytestmark = pytest.mark.redis


@pytest.fixture
def down_app() -> Iterator[Celery]:
    app = Celery("outage", broker=f"redis://127.0.0.1:{free_port()}/0", set_as_current=False)
    app.conf.broker_connection_retry_on_startup = False
    app.conf.task_publish_retry_policy = {"max_retries": 0}
    yield app
    app.close()


def _retry_on(app: Celery, base: type[Task]) -> Reject:
    @app.task(bind=True, base=base, shared=False, name=f"outage.{base.__name__}")
    def step(self: Task) -> None:  # pragma: no cover - only its retry is called
        del self

    step.push_request(
        id="solve-1", retries=0, args=(), kwargs={}, delivery_info={}, called_directly=False
    )
    try:
        with pytest.raises(Reject) as info:
            step.retry(exc=StoreUnavailable("Redis is down"), countdown=1)
    finally:
        step.pop_request()
    return info.value


def test_celerys_own_retry_drops_the_message_when_the_broker_is_down(down_app: Any) -> None:
    # The premise: without OutageTask the message would be rejected for good.
    assert _retry_on(down_app, Task).requeue is False


def test_an_outage_task_leaves_its_message_to_the_broker(down_app: Any) -> None:
    rejected = _retry_on(down_app, OutageTask)
    assert rejected.requeue is True


def test_solve_and_submit_are_outage_tasks() -> None:
    assert isinstance(solve, OutageTask) and isinstance(submit, OutageTask)

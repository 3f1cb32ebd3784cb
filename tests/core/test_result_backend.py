"""The result backend whose ``get()`` waits out a Redis outage
(``captcha_tasks.worker.celery_compat.backend``): its pure parts (the back-off, what counts
as an outage, the URL that selects it), and on the suite's Redis that what the caller's own
callbacks raise is never taken for an outage.  The outages themselves:
``tests/worker/test_get_outage.py``."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import redis
from celery.exceptions import TimeoutError as CeleryTimeout

from captcha_tasks.worker.broker import REDIS_BACKEND, SENTINEL_BACKEND, backend_url
from captcha_tasks.worker.celery_compat import backend


@pytest.mark.unit
def test_the_back_off_doubles_to_a_second_and_never_passes_the_timeout() -> None:
    assert [backend.outage_wait(n, None) for n in (1, 2, 3, 4, 5, 9)] == [
        0.1,
        0.2,
        0.4,
        0.8,
        1.0,
        1.0,
    ]
    assert backend.outage_wait(5, 0.3) == 0.3
    assert backend.outage_wait(1, 0.0) is None
    assert backend.outage_wait(7, -1.0) is None


@pytest.mark.unit
def test_what_counts_as_an_outage() -> None:
    refused = redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379")
    gave_up = RuntimeError("Retry limit exceeded while trying to reconnect")
    gave_up.__cause__ = refused
    for outage in (refused, redis.TimeoutError(), redis.BusyLoadingError(), OSError(), gave_up):
        assert backend.is_outage(outage), outage
    for other in (RuntimeError("a bug"), KeyError("x"), CeleryTimeout(), ValueError()):
        assert not backend.is_outage(other), other


@pytest.mark.unit
@pytest.mark.parametrize(
    ("url", "selected"),
    [
        ("redis://localhost:6379/0", f"{REDIS_BACKEND}+redis://localhost:6379/0"),
        ("rediss://:pw@host:6380/1", f"{REDIS_BACKEND}+rediss://:pw@host:6380/1"),
        (
            "sentinel://h:26379;sentinel://h2",
            f"{SENTINEL_BACKEND}+sentinel://h:26379;sentinel://h2",
        ),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
    ],
)
def test_the_result_backend_url_selects_ours(url: str, selected: str) -> None:
    assert backend_url(url) == selected


@pytest.mark.redis
def test_the_apps_backend_is_ours(app: Any) -> None:
    assert isinstance(app.backend, backend.RedisBackend)


@pytest.mark.redis
def test_what_the_callers_own_callback_raises_is_raised_at_once(app: Any) -> None:
    """An ``on_interval`` that raises an ``OSError`` (a failed parent of a chain is raised
    from there too) is the caller's, not an outage to wait out until the timeout."""
    from celery.result import AsyncResult

    def broken() -> None:
        raise OSError("the caller's own")

    began = time.monotonic()
    with pytest.raises(OSError, match="the caller's own"):
        AsyncResult(f"nothing-{uuid.uuid4()}", app=app).get(timeout=20, on_interval=broken)
    assert time.monotonic() - began < 10  # not waited out as an outage (20 s, then another error)
    # and with Redis up and no result, the timeout is Celery's own
    with pytest.raises(CeleryTimeout):
        AsyncResult(f"nothing-{uuid.uuid4()}", app=app).get(timeout=0.5)

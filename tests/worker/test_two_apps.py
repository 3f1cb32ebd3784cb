"""Two apps of captcha-tasks in one process, each built from its own settings value
(``new_app``), neither of them in this process's environment: each sends its solves to its
own broker and queues, and its outcome lands in its own Redis.  Each deployment has its
worker process (started with that deployment's environment)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from captcha_tasks.settings import Settings
from captcha_tasks.testing.processes import CeleryProcess, RedisServer
from captcha_tasks.worker import names
from captcha_tasks.worker.app import App
from captcha_tasks.worker.app import app as package_app
from captcha_tasks.worker.tasks import new_app

pytestmark = pytest.mark.e2e

PAGE = "https://example.com/two-apps"


def deployment_env(redis_url: str, sandbox_url: str, name: str) -> dict[str, str]:
    return {
        **os.environ,
        "REDIS_URL": redis_url,
        "CAPTCHAAI_BASE_URL": sandbox_url,
        "CAPTCHAAI_KEY_PREFIX": f"ct-{name}",
        "CAPTCHAAI_QUEUE_PREFIX": f"ct-{name}",
    }


@pytest.fixture
def two_apps(
    redis_url: str, sandbox_server: Any, output_dir: Path
) -> Iterator[tuple[App, App, redis.Redis, redis.Redis]]:
    with RedisServer(log_dir=output_dir) as second:
        second.start()
        envs = [
            deployment_env(redis_url, sandbox_server.url, "first"),
            deployment_env(second.url, sandbox_server.url, "second"),
        ]
        workers = [
            CeleryProcess("worker", env=env, concurrency=4, log_dir=output_dir, name=f"two-{n}")
            for n, env in enumerate(envs)
        ]
        try:
            for worker in workers:
                worker.start()
            first_app, second_app = (
                new_app(f"app{n}", Settings.from_env(env)) for n, env in enumerate(envs)
            )
            yield (
                first_app,
                second_app,
                redis.Redis.from_url(redis_url),
                redis.Redis.from_url(second.url),
            )
        finally:
            for worker in workers:
                worker.stop()


def test_two_apps_send_their_solves_through_their_own_redis(
    two_apps: tuple[App, App, redis.Redis, redis.Redis],
) -> None:
    first, second, first_redis, second_redis = two_apps
    assert first.conf.broker_url != second.conf.broker_url
    assert first.conf.task_default_queue == "ct-first.solve"
    assert second.conf.task_default_queue == "ct-second.solve"
    assert package_app.conf.task_default_queue not in ("ct-first.solve", "ct-second.solve")
    sent = {
        one: one.tasks[names.SOLVE].delay(method="turnstile", sitekey=f"0x{i}AAA", pageurl=PAGE)
        for i, one in enumerate((first, second))
    }
    for result in sent.values():
        outcome = result.get(timeout=60)
        assert outcome["status"] == "solved", outcome
    meta = {one: f"celery-task-meta-{result.id}" for one, result in sent.items()}
    assert first_redis.exists(meta[first]) and not second_redis.exists(meta[first])
    assert second_redis.exists(meta[second]) and not first_redis.exists(meta[second])
    # each app's own Redis keys: the limiter of each deployment saw only its own solve
    assert first_redis.keys("ct-first:*") and not first_redis.keys("ct-second:*")
    assert second_redis.keys("ct-second:*") and not second_redis.keys("ct-first:*")

"""Secret hygiene: the API key, proxy passwords and cookie values stay out of Redis task
data, worker logs and task events; tokens are not logged whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_flower import PASSWORD, USER, FlowerProcess, _flower_env, _prime_events

from captcha_tasks import solve
from captcha_tasks.batch import stream
from captcha_tasks.testing.processes import CeleryProcess, RedisServer, wait_until
from captcha_tasks.worker.app import app

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("clean_state")]

PAGE = "https://example.com/secret"
PROXY_PASSWORD = "Pr0xyS3cret"
COOKIE_VALUE = "C00kieValue42"


def dump_redis(conn: Any) -> str:
    """Every key and value in the database, as text."""
    parts = []
    for key in conn.scan_iter(count=1000):
        kind = conn.type(key)
        if kind == "string":
            value: Any = conn.get(key)
        elif kind == "hash":
            value = conn.hgetall(key)
        elif kind == "list":
            value = conn.lrange(key, 0, -1)
        elif kind == "set":
            value = conn.smembers(key)
        elif kind == "zset":
            value = conn.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            value = conn.xrange(key)
        else:
            value = ""
        parts.append(f"{key} {value}")
    return "\n".join(parts)


def test_no_secret_in_redis_logs_or_flower(
    sandbox: Any, start_worker: Any, redis_conn: Any, output_dir: Path
) -> None:
    # One thread: solves park, and their jobs travel in submit messages too.
    worker = start_worker({"CAPTCHAAI_THREADS": "1"}, name="secrets-worker")
    flower = FlowerProcess(_flower_env(FLOWER_BASIC_AUTH=f"{USER}:{PASSWORD}"), output_dir)
    flower.start()
    _prime_events(flower)  # Flower turns task events on in the worker
    secret_task = {
        "method": "turnstile",
        "sitekey": "k",
        "pageurl": PAGE,
        "proxy": f"bob:{PROXY_PASSWORD}@10.1.2.3:3128",
        "cookies": f"session={COOKIE_VALUE}",
    }
    plain = {"method": "userrecaptcha", "sitekey": "k", "pageurl": PAGE}
    results = list(stream([secret_task, plain, secret_task, plain]))
    single = solve.delay(**secret_task).get(timeout=30)
    tokens = [r["token"] for r in results if r["status"] == "solved"] + [single["token"]]
    assert len(tokens) == 5
    api_key = app.runtime().settings.providers.api_key
    everything = dump_redis(redis_conn)
    log = worker.log_text()
    assert "succeeded" in log  # the log did record the tasks
    try:
        wait_until(lambda: len(flower.api_tasks()) >= 11, 20, what="Flower to see the tasks")
        flower_output = str(flower.api_tasks())
    finally:
        flower.stop()
    assert "captcha_tasks.submit" in flower_output
    sources = ((everything, "Redis"), (log, "worker log"), (flower_output, "Flower API"))
    for haystack, where in sources:
        assert api_key not in haystack, where
        assert PROXY_PASSWORD not in haystack, where
        assert COOKIE_VALUE not in haystack, where
    for token in tokens:
        assert token not in log
        assert token not in flower_output


def test_password_protected_redis_for_broker_results_and_store(
    sandbox: Any, output_dir: Path
) -> None:
    password = "pw-" + os.urandom(6).hex()
    with RedisServer(log_dir=output_dir / "redis-auth", password=password) as server:
        server.start()
        env = {**os.environ, "CAPTCHAAI_BASE_URL": sandbox.url, "REDIS_URL": server.url}
        worker = CeleryProcess("worker", env=env, log_dir=output_dir, name="auth-worker")
        with worker:
            worker.start()
            cli = [
                sys.executable,
                "-m",
                "captcha_tasks.cli",
                "solve",
                "--method",
                "turnstile",
                "--sitekey",
                "k",
                "--pageurl",
                "https://example.com/",
                "--timeout",
                "30",
            ]
            done = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert sandbox.verify(done.stdout.strip())["success"] is True
        assert password not in worker.log_text()

"""Lanes, tenants and budgets end to end: real worker processes, Redis and the sandbox
over HTTP, through the public calls (``solve.delay``, ``stream()``, ``captcha-tasks batch``
and ``captcha-tasks tenants``).  Timings are the benchmark's business
(``scripts/bench_lanes.py``); these check who gets the threads, and what is paid for."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from captcha_tasks import aio, errors, solve
from captcha_tasks.batch import stream
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker.app import app

pytestmark = pytest.mark.e2e

PAGE = "https://example.com/lanes"
MODULE_ENV = {
    "CAPTCHAAI_TENANTS": json.dumps(
        {"shop": {"weight": 2}, "crawler": {"weight": 1}, "thrifty": {"daily_captchas": 8}}
    ),
}


def task(**extra: Any) -> dict[str, Any]:
    return {"method": "turnstile", "sitekey": "k", "pageurl": PAGE, **extra}


@pytest.fixture
def two_workers(start_worker: Any, clean_state: None) -> list[Any]:
    return [start_worker(concurrency=16, name=f"lanes-w{n}") for n in range(2)]


class Batch(threading.Thread):
    """A ``stream()`` of ``tasks`` in a thread, recording each outcome as it arrives in
    ``arrivals`` (shared between batches: the order they completed in, all together)."""

    def __init__(
        self,
        tasks: list[dict[str, Any]],
        arrivals: list[tuple[str, Any]],
        tag: str,
        **options: Any,
    ):
        super().__init__(daemon=True)
        self.tasks, self.arrivals, self.tag, self.options = tasks, arrivals, tag, options
        self.outcomes: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for outcome in stream(self.tasks, timeout_per_task=60, **self.options):
                self.outcomes.append(outcome)
                with self.lock:
                    self.arrivals.append((self.tag, outcome))
        except BaseException as exc:  # the test thread reports it
            self.error = exc

    def finish(self, timeout: float = 90) -> list[dict[str, Any]]:
        self.join(timeout)
        assert not self.is_alive(), f"batch {self.tag} did not finish"
        assert self.error is None, self.error
        return self.outcomes


class Grants(threading.Thread):
    """The tenants handed a thread, in the order the limiter's scripts handed them out.

    Redis's ``MONITOR`` shows the commands a script runs, in the order it runs them, and
    each grant counts one more slot held (``HINCRBY <lane counts> held|<lane>|<tenant> 1``,
    lib/slots.lua).  The captchas' ids only say the order their submits reached the
    provider, which a loaded machine reorders (a CI run saw a crawler's submit overtake
    three of the shop's granted before it)."""

    def __init__(self, redis_url: str, counts_key: str) -> None:
        super().__init__(daemon=True)
        self.url, self.counts_key = redis_url, counts_key
        self.tenants: list[str] = []
        #: Sent by :meth:`stop`: the reader has read everything before it when it reads it.
        self.end = f"grants-end-{uuid.uuid4().hex}"
        self.closing = False
        self.monitor = redis.Redis.from_url(redis_url).monitor()
        self.monitor.__enter__()  # MONITOR answered: every later command is seen

    def run(self) -> None:
        try:
            for command in self.monitor.listen():
                words = command["command"].split(" ")
                if words == ["ECHO", self.end]:
                    return
                if words[:2] == ["HINCRBY", self.counts_key] and words[3:] == ["1"]:
                    kind, _lane, tenant = words[2].split("|")
                    if kind == "held":
                        self.tenants.append(tenant)
        except Exception:
            if not self.closing:  # closed under the reader by close(): nothing to report
                raise

    def stop(self) -> list[str]:
        """Every grant made before this call, once the reader has caught up with MONITOR
        (it reads behind the commands on a loaded machine)."""
        with redis.Redis.from_url(self.url) as conn:
            conn.echo(self.end)
        self.join(60)
        assert not self.is_alive(), "the MONITOR reader did not catch up within 60 s"
        return self.tenants

    def close(self) -> None:
        self.closing = True
        self.monitor.connection.disconnect()
        self.join(10)


@pytest.fixture
def grants(redis_url: str, two_workers: list[Any]) -> Iterator[Grants]:
    watcher = Grants(redis_url, app.runtime().state.limiter.keys.lane_counts())
    watcher.start()
    yield watcher
    watcher.close()


def test_an_interactive_solve_takes_the_next_thread_ahead_of_a_bulk_backlog(
    sandbox: Any, two_workers: list[Any]
) -> None:
    sandbox.configure(solve_time=1.0, jitter=0.0)
    limiter = app.runtime().state.limiter
    batch = Batch([task(sitekey=f"bulk-{i}") for i in range(60)], [], "bulk")
    batch.start()

    def bulk_parked() -> int:
        use = limiter.lanes().get(("bulk", "default"))
        return use.parked if use else 0

    wait_until(lambda: bulk_parked() >= 10, 30, what="a bulk backlog")
    backlog = bulk_parked()
    view = solve.delay(method="turnstile", sitekey="view", pageurl=PAGE).get(timeout=30)
    bulk = batch.finish()
    assert view["status"] == "solved" and all(o["status"] == "solved" for o in bulk)
    # captcha ids are handed out in the order the sandbox took the captchas: the bulk work
    # parked before the view's solve went to the provider after it
    behind = [o for o in bulk if int(o["captcha_id"]) > int(view["captcha_id"])]
    assert len(behind) >= backlog - 2, (len(behind), backlog)
    assert sandbox.stats()["peak_in_flight"] <= app.runtime().settings.providers.capacity


def test_freed_threads_follow_the_tenants_weights(
    sandbox: Any, two_workers: list[Any], grants: Grants
) -> None:
    # The sandbox holds every answer (its latch) while the crawler's batch takes every
    # thread and both tenants park the rest of their work: the state is the same however
    # loaded the machine is, and each freed thread after the release is a choice.
    sandbox.configure(solve_time=0.3, jitter=0.1, hold=True)
    limiter = app.runtime().state.limiter
    capacity = app.runtime().settings.providers.capacity
    arrivals: list[tuple[str, Any]] = []
    n = 150
    crawler = Batch(
        # the whole stream() may name its tenant, or each task may
        [task(sitekey=f"crawler-{i}") for i in range(n)],
        arrivals,
        "crawler",
        tenant="crawler",
        window=n,
    )
    shop = Batch(
        [task(sitekey=f"shop-{i}", tenant="shop") for i in range(n)], arrivals, "shop", window=n
    )

    def parked() -> int:
        lanes = limiter.lanes()
        return sum(use.parked for key, use in lanes.items() if key[1] in ("shop", "crawler"))

    crawler.start()
    wait_until(lambda: sandbox.stats()["in_flight"] == capacity, 60, what="every thread taken")
    shop.start()
    wait_until(lambda: parked() == 2 * n - capacity, 60, what="the rest of both batches parked")
    sandbox.configure(hold=False)
    for batch in (crawler, shop):
        outcomes = batch.finish()
        assert len(outcomes) == n and all(o["status"] == "solved" for o in outcomes)
    handed = grants.stop()
    assert Counter(handed) == {"crawler": n, "shop": n}, "".join(t[0] for t in handed)
    assert handed[:capacity] == ["crawler"] * capacity
    # The shop came back from idle: it is owed the share it missed, one plan's worth of
    # threads at most (lib/slots.lua), and takes it first.
    run = next(i for i, tag in enumerate(handed[capacity:]) if tag != "shop")
    assert capacity <= run <= capacity + 3, "".join(t[0] for t in handed)
    # Past that, while both have work parked, two of every three freed threads are the shop's.
    settled = capacity + run
    shared = Counter(handed[settled : settled + 2 * n * 2 // 5])
    assert 1.7 <= shared["shop"] / shared["crawler"] <= 2.3, (shared, "".join(t[0] for t in handed))
    solved = app.runtime().state.stats.lane_outcomes()
    assert solved[("solved", "bulk", "shop")] == solved[("solved", "bulk", "crawler")] == n


def test_a_spent_budget_fails_the_rest_without_paying_for_them(
    sandbox: Any, two_workers: list[Any], env: dict[str, str], tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(task(sitekey=f"t-{i}")) + "\n" for i in range(10)))
    out = tmp_path / "out.jsonl"
    cli = [sys.executable, "-m", "captcha_tasks.cli"]
    done = subprocess.run(
        [*cli, "batch", str(tasks), "-o", str(out), "--tenant", "thrifty"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr  # some failed
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert Counter(line.get("error", line["status"]) for line in lines) == {
        "solved": 8,
        "ERROR_BUDGET_EXCEEDED": 2,
    }
    assert sandbox.stats()["submits"] == 8
    # a solve of its own fails the same way, at once
    with pytest.raises(errors.BudgetExceeded, match="thrifty"):
        solve.delay(method="turnstile", sitekey="k", pageurl=PAGE, tenant="thrifty").get(30)
    assert sandbox.stats()["submits"] == 8

    shown = subprocess.run(
        [*cli, "tenants", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    rows = {row["name"]: row for row in json.loads(shown.stdout)}
    assert set(rows) == {"crawler", "default", "shop", "thrifty"}
    thrifty = rows["thrifty"]
    assert (thrifty["submitted_today"], thrifty["daily_captchas"], thrifty["budget_left"]) == (
        8,
        8,
        0,
    )
    assert (thrifty["solved"], thrifty["failed"]) == (8, 3)
    table = subprocess.run(
        [*cli, "tenants"], env=env, capture_output=True, text=True, timeout=60
    ).stdout
    assert "thrifty" in table and "00:00 UTC" in table


def test_an_unknown_tenant_or_lane_is_refused_before_anything_is_queued(
    redis_conn: Any, env: dict[str, str], tmp_path: Path
) -> None:
    settings = app.runtime().settings
    before = {q: redis_conn.llen(q) for q in settings.celery.queues}
    with pytest.raises(errors.ValidationError, match="unknown tenant 'shp'"):
        solve.delay(method="turnstile", sitekey="k", pageurl=PAGE, tenant="shp")
    with pytest.raises(errors.ValidationError, match="unknown lane 'urgent'"):
        solve.delay(method="turnstile", sitekey="k", pageurl=PAGE, lane="urgent")
    with pytest.raises(errors.ValidationError, match="unknown tenant 'shp'"):
        asyncio.run(aio.solve(method="turnstile", sitekey="k", pageurl=PAGE, tenant="shp"))
    # a batch's own lane and tenant are checked when it is called, before it is iterated
    with pytest.raises(errors.ValidationError, match="unknown tenant 'shp'"):
        stream([task()], tenant="shp")
    with pytest.raises(errors.ValidationError, match="unknown lane 'urgent'"):
        aio.stream([task()], lane="urgent")
    assert {q: redis_conn.llen(q) for q in before} == before
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(task()) + "\n" + json.dumps(task(tenant="nobody")) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "captcha_tasks.cli", "batch", str(tasks)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "line 2: ERROR_VALIDATION: unknown tenant 'nobody'" in done.stderr


def test_each_lane_has_its_own_solve_queue(redis_conn: Any) -> None:
    # no worker consumes this module's queues here: the messages stay where they were sent
    settings = app.runtime().settings
    bulk = solve.apply_async(kwargs=task(lane="bulk"))
    view = solve.apply_async(kwargs=task())
    try:
        assert redis_conn.llen(settings.celery.solve_queue("bulk")) == 1
        assert redis_conn.llen(settings.celery.solve_queue("interactive")) == 1
    finally:
        for result in (bulk, view):
            result.revoke()
        for queue in settings.celery.solve_queues:
            redis_conn.delete(queue)

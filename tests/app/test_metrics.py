"""The Prometheus endpoint: figures read from the real Redis a real worker fills, and 503
(never a crash) while Redis is down."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from captcha_tasks import solve
from captcha_tasks.errors import FatalError
from captcha_tasks.metrics import SOLVE_TIME_BUCKETS, StoreCollector, _buckets, make_wsgi_app
from captcha_tasks.state.board import Completion
from captcha_tasks.state.limiter import WAIT_BUCKETS_S
from captcha_tasks.testing.processes import CeleryProcess, RedisServer, free_port, wait_until
from captcha_tasks.worker.app import app
from captcha_tasks.worker.tasks import create_pool, prewarm

PAGE = "https://example.com/metrics"
POOL = "metrics-pool"
#: The primary's name (CAPTCHAAI_PROVIDER_NAME's default): every figure is labelled with it.
PROVIDER = "captchaai"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _hold(limiter: Any, lease: str) -> str:
    """Take a thread (or park) for ``lease`` as a submit of the pipeline would."""
    return str(limiter.admit(lease, "{}", attempt=0, deadline_in_s=30).status)


def _scrape(url: str) -> Samples:
    resp = requests.get(url, timeout=10)
    assert resp.status_code == 200, resp.text
    samples: Samples = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _labels(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, _labels(**labels))]


# -- figures from a working deployment -----------------------------------------------------


def _pool_idle() -> dict[str, Any]:
    """The pool's status once its refills have landed."""
    pools = app.runtime().state.pools

    def idle() -> dict[str, Any] | None:
        status = pools.status(POOL)
        return status if status["live"] >= 1 and status["inflight"] == 0 else None

    status = wait_until(idle, 30, interval=0.1, what="the pool refills")
    assert isinstance(status, dict)
    return status


@pytest.mark.e2e
def test_metrics_report_threads_pools_errors_and_solve_times(
    worker: CeleryProcess, sandbox: Any, clean_state: None, metrics_url: str, redis_conn: Any
) -> None:
    results = [solve.delay(method="turnstile", sitekey="k", pageurl=PAGE) for _ in range(3)]
    assert all(r.get(timeout=30)["status"] == "solved" for r in results)
    bad = solve.delay(method="turnstile", sitekey="k", pageurl=PAGE, proxy="u:p@bad-proxy:1")
    with pytest.raises(FatalError) as failed:
        bad.get(timeout=30)

    # PoolStore.take, unlike take_token, starts no refill in the background: nothing may
    # run on the worker while the limiter is filled below.
    pools = app.runtime().state.pools
    create_pool(POOL, "turnstile", "metrics-key", PAGE, size=2, ttl=120)
    pools.reset_stats(POOL)
    assert pools.take(POOL) is None  # a miss
    assert prewarm.delay(POOL).get(timeout=30)[POOL] >= 1
    _pool_idle()
    assert pools.take(POOL) is not None  # a hit

    # Hold every thread and park one submit behind them, once the worker's threads check
    # counts no thread as another client's: a check that asks the provider while a refill
    # takes its thread counts that thread as not ours until the next check (by design: it
    # never over-subscribes), and then one of the holds below would park.
    limiter = app.runtime().state.limiter
    capacity = limiter.config.capacity
    wait_until(
        lambda: limiter.in_use() == 0 and limiter.external() == 0,
        30,
        interval=0.1,
        what="every thread free and none counted as another client's",
    )
    # ... and no check starts while the holds are taken (the deployment-wide lock a check
    # takes when it is due, held here for the rest of the test).
    redis_conn.set(limiter.keys.threads_check_lock(), "1", px=60_000)
    held = [f"metrics-lease-{i}" for i in range(capacity)]
    for lease in held:
        assert _hold(limiter, lease) == "go"
    assert _hold(limiter, "metrics-parked") == "parked"
    try:
        samples = _scrape(metrics_url)
        # read at once after the scrape (no refill runs while every thread is held): the
        # target follows the take rate, which decays while the test waits above
        pool_status = pools.status(POOL)
    finally:
        for lease in [*held, "metrics-parked"]:
            app.runtime().state.board.finish(Completion(lease, "turnstile"))

    assert _value(samples, "captcha_tasks_threads_plan") == 15
    assert _value(samples, "captcha_tasks_threads_capacity") == capacity
    assert _value(samples, "captcha_tasks_threads_in_use") == capacity
    assert _value(samples, "captcha_tasks_thread_utilisation_ratio") == 1.0
    assert _value(samples, "captcha_tasks_parked_submits") == 1

    pool = {"pool": POOL}
    assert _value(samples, "captcha_tasks_pool_live_tokens", **pool) == pool_status["live"]
    assert _value(samples, "captcha_tasks_pool_size", **pool) == 2
    assert _value(samples, "captcha_tasks_pool_target_tokens", **pool) == pool_status["target"]
    assert _value(samples, "captcha_tasks_pool_tokens_taken_total", **pool) == 1
    assert _value(samples, "captcha_tasks_pool_misses_total", **pool) == 1
    assert _value(samples, "captcha_tasks_pool_tokens_added_total", **pool) >= 1
    assert _value(samples, "captcha_tasks_pool_hit_ratio", **pool) == 0.5
    assert _value(samples, "captcha_tasks_pool_refills_in_flight", **pool) == 0

    code = failed.value.code
    assert _value(samples, "captcha_tasks_api_errors_total", code=code, provider=PROVIDER) >= 1

    turnstile = {"method": "turnstile", "provider": PROVIDER}
    polled = [
        samples.get(("captcha_tasks_solved_total", _labels(**turnstile, source=s)), 0)
        for s in ("poll", "bulk_poll")
    ]
    assert sum(polled) >= 3 + 1  # three solves and at least one pool refill, all polled
    assert (
        "captcha_tasks_solved_total",
        (("method", "turnstile"), ("source", "api")),
    ) not in samples
    recent = redis_conn.llen(app.runtime().state.keys.solve_times("turnstile"))
    assert _value(samples, "captcha_tasks_solve_seconds_gcount", **turnstile) == recent
    assert _value(samples, "captcha_tasks_solve_seconds_bucket", le="+Inf", **turnstile) == recent
    assert 0 < _value(samples, "captcha_tasks_solve_seconds_gsum", **turnstile) < recent * 5


@pytest.mark.e2e
def test_pooled_solves_are_counted_with_source_pool(
    worker: CeleryProcess, sandbox: Any, clean_state: None, output_dir: Path, env: dict[str, str]
) -> None:
    name, sitekey = "counted-pool", "counted-key"
    create_pool(name, "turnstile", sitekey, PAGE, size=3, ttl=120)
    assert prewarm.delay(name).get(timeout=30)[name] >= 1
    pools = app.runtime().state.pools
    wait_until(lambda: pools.live(name) >= 2, 30, interval=0.1, what="the pool to fill")
    results = [
        solve.delay(method="turnstile", sitekey=sitekey, pageurl=PAGE).get(timeout=30)
        for _ in range(2)
    ]
    pooled = sum(r["source"] == "pool" for r in results)
    assert pooled >= 1
    # What `captcha-tasks metrics` serves, from a process of its own.
    exporter = MetricsProcess(env, output_dir / "metrics-pooled.log")
    try:
        wait_until(exporter.answering, 20, interval=0.1, what="the metrics process")
        samples = _scrape(exporter.url)
    finally:
        exporter.stop()
    counted = _value(
        samples, "captcha_tasks_solved_total", method="turnstile", source="pool", provider=PROVIDER
    )
    assert counted == pooled


@pytest.mark.redis
def test_lanes_tenants_and_budgets_are_counted(metrics_url: str, clean_state: None) -> None:
    """What the limiter and the completion count, read through the exporter: threads and
    parked submits by lane and tenant, waits, the budget, endings."""
    state = app.runtime().state
    limiter = state.limiter
    capacity = limiter.config.capacity
    held = [f"lanes-lease-{i}" for i in range(capacity)]
    asked = time.time() - 0.2
    for lease in held:
        admission = limiter.admit(lease, "{}", attempt=0, deadline_in_s=30, asked_at=asked)
        assert admission.status == "go"
    # every wait is at least 0.2 s and at most this, however slowly the admissions went
    longest = time.time() - asked
    bucket = min(b for b in WAIT_BUCKETS_S if b >= longest)
    parked = limiter.admit("lanes-parked", "{}", attempt=0, deadline_in_s=30, lane="bulk")
    assert parked.status == "parked"
    done = Completion(held[0], "turnstile", solved=True, lane="interactive", tenant="default")
    try:
        state.board.finish(done)
        samples = _scrape(metrics_url)
    finally:
        for lease in [*held, "lanes-parked"]:
            state.board.finish(Completion(lease, "turnstile"))

    where = {"lane": "interactive", "tenant": "default"}
    # the first lease freed went to the parked bulk submit
    assert _value(samples, "captcha_tasks_lane_in_flight", **where) == capacity - 1
    assert _value(samples, "captcha_tasks_lane_in_flight", lane="bulk", tenant="default") == 1
    assert _value(samples, "captcha_tasks_lane_parked", lane="bulk", tenant="default") == 0
    assert _value(samples, "captcha_tasks_lane_parked", lane="background", tenant="default") == 0
    assert _value(samples, "captcha_tasks_lane_solved_total", **where) == 1
    assert _value(samples, "captcha_tasks_wait_seconds_count", **where) == capacity
    assert _value(samples, "captcha_tasks_wait_seconds_bucket", le="0.1", **where) == 0
    assert _value(samples, "captcha_tasks_wait_seconds_bucket", le=str(bucket), **where) == capacity
    waited = _value(samples, "captcha_tasks_wait_seconds_sum", **where)
    assert 0.2 * capacity <= waited <= longest * capacity
    assert _value(samples, "captcha_tasks_tenant_submitted_today", tenant="default") == capacity
    assert _value(samples, "captcha_tasks_tenant_weight", tenant="default") == 1


@pytest.mark.redis
def test_every_queue_and_priority_sub_list_is_counted(redis_conn: Any) -> None:
    # queues of their own, which no worker of this module consumes
    settings = app.runtime().settings.replace(celery={"queue_prefix": f"idle-{os.getpid()}"})
    bulk, submit = settings.celery.solve_queue("bulk"), settings.celery.queue("submit")
    redis_conn.rpush(bulk, "m1", "m2")
    redis_conn.rpush(f"{submit}\x06\x169", "m3")  # how kombu keeps a priority-9 message
    try:
        found = StoreCollector(settings, app.runtime().state).collect()
        [family] = [f for f in found if f.name == "captcha_tasks_queue_messages"]
    finally:
        redis_conn.delete(bulk, f"{submit}\x06\x169")
    sizes = {(s.labels["queue"], s.labels["priority"]): s.value for s in family.samples}
    assert len(sizes) == len(settings.celery.queues) * 4  # each queue, each of its sub-lists
    assert (sizes[(bulk, "0")], sizes[(bulk, "3")], sizes[(submit, "9")]) == (2, 0, 1)
    assert sum(sizes.values()) == 3


@pytest.mark.redis
def test_buckets_are_cumulative() -> None:
    buckets = dict(_buckets([0.5, 1.0, 2.5, 500.0]))
    assert buckets["1.0"] == 2  # le is inclusive
    assert buckets["3.0"] == 3
    assert buckets[repr(SOLVE_TIME_BUCKETS[-1])] == 3
    assert buckets["+Inf"] == 4


@pytest.mark.redis
def test_openmetrics_is_negotiated(metrics_url: str, clean_state: None) -> None:
    resp = requests.get(
        metrics_url, headers={"Accept": "application/openmetrics-text; version=1.0.0"}, timeout=10
    )
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
    assert resp.text.rstrip().endswith("# EOF")
    assert "# TYPE captcha_tasks_solve_seconds gaugehistogram" in resp.text


@pytest.mark.redis
def test_unknown_path_is_404(metrics_url: str) -> None:
    assert requests.get(metrics_url.replace("/metrics", "/nope"), timeout=5).status_code == 404


# -- failures ------------------------------------------------------------------------------


class _Broken(Collector):
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def collect(self) -> Iterator[Any]:
        raise self.exc

    def describe(self) -> list[Any]:
        return []


def _call(app: Any) -> tuple[str, bytes]:
    got: dict[str, str] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        got["status"] = status

    body = b"".join(app({"PATH_INFO": "/metrics", "REQUEST_METHOD": "GET"}, start_response))
    return got["status"], body


@pytest.mark.redis
def test_a_collector_bug_is_a_500_not_a_crash() -> None:
    status, body = _call(make_wsgi_app(_Broken(ValueError("bug"))))
    assert status.startswith("500")
    assert b"bug" not in body  # no internals on the wire


class MetricsProcess:
    """``metrics_command`` (what ``captcha-tasks metrics`` runs) in a child process."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        code = "from captcha_tasks.metrics import metrics_command; metrics_command()"
        argv = [sys.executable, "-c", code, "--port", str(self.port)]
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    def answering(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the metrics process exited with {self.proc.returncode}")
        try:
            requests.get(self.url, timeout=10)
        except requests.ConnectionError:
            return False
        return True

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.mark.redis
def test_redis_down_is_a_503_with_the_reason_and_recovers(output_dir: Path) -> None:
    redis_port = free_port()
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0"}
    exporter = MetricsProcess(env, output_dir / "metrics-redis-down.log")
    try:
        wait_until(exporter.answering, 20, interval=0.1, what="the metrics process")
        for _ in range(2):  # it keeps answering: the failure cost one scrape each
            resp = requests.get(exporter.url, timeout=10)
            assert resp.status_code == 503
            assert "Redis unreachable" in resp.text
            assert resp.headers["Retry-After"] == "5"
        with RedisServer(port=redis_port, log_dir=output_dir).start():
            wait_until(
                lambda: requests.get(exporter.url, timeout=10).status_code == 200,
                20,
                interval=0.2,
                what="metrics to recover",
            )
            text = requests.get(exporter.url, timeout=10).text
            assert "captcha_tasks_threads_in_use 0.0" in text
    finally:
        exporter.stop()


@pytest.mark.redis
def test_master_changes_and_reconnects_are_served(metrics_url: str, state: Any) -> None:
    """What housekeeping counts of a master change, and what each process adds of its
    reconnects, is served as the deployment's totals (the failover tests drive them for
    real: tests/ha/test_failover_batch.py)."""
    from captcha_tasks.state.connections import MasterChangeLog

    before = _scrape(metrics_url)
    state.master_changes.note_master()
    state.redis.set(state.keys.redis_master(), "a-master-that-is-gone")
    assert state.master_changes.note_master()
    log, connection = MasterChangeLog(), type("Connection", (), {"_was_connected": True})()
    log.connected(connection, "127.0.0.1", 1)
    state.master_changes.report("receiver", log)
    after = _scrape(metrics_url)
    changes = "captcha_tasks_redis_master_changes_total"
    assert _value(after, changes) == _value(before, changes) + 1
    assert _value(after, "captcha_tasks_redis_reconnects_total", process="receiver") == 1

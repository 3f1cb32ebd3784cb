#!/usr/bin/env python3
"""Kafka bridge benchmark (not a test; prints a table).

Starts its own Redis, sandbox (instant solves, generous threads), one Celery worker, a
single-node Kafka broker (from Maven Central, see ``harness.kafka_broker``) and
one bridge, and stops them all.  Measures:

* throughput: ``--tasks`` tasks enqueued at once through the bridge, and the same number
  of direct ``solve.delay`` calls, from the first enqueue to the last result;
* latency: ``--samples`` sequential tasks each way, alternating: ``solve.delay().get()``
  against enqueue -> result read from the results topic.  The difference is the
  latency the bridge adds (p50, p99).

    python scripts/bench_kafka.py [--tasks 300] [--samples 200] [--partitions 6]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import repo_root  # noqa: F401  (puts harness/ on sys.path)

from captcha_tasks.state.limiter import LimiterConfig
from captcha_tasks.testing.processes import CeleryProcess, RedisServer
from captcha_tasks.testing.sandbox import SandboxConfig, SandboxServer
from harness.kafka_broker import BridgeProcess, KafkaBroker, missing_tools

KEY = "bench-key"
PAGE = "https://example.com/bench-kafka"
THREADS = 100
CONCURRENCY = 32


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=6)
    args = parser.parse_args()
    # The broker's transient start-up notices (coordinator loading) are not results.
    logging.getLogger("captcha_tasks.librdkafka").setLevel(logging.ERROR)
    problem = missing_tools()
    if problem:
        print(f"cannot start a Kafka broker: {problem}", file=sys.stderr)
        return 2
    log_dir = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    procs: list[Any] = []
    sandbox = SandboxServer(
        SandboxConfig(threads=THREADS, solve_time=0.0, jitter=0.0, api_keys=(KEY,))
    ).start()
    try:
        redis_server = RedisServer(log_dir=log_dir)
        procs.append(redis_server)
        redis_server.start()
        broker = KafkaBroker(log_dir=log_dir)
        procs.append(broker)
        broker.start()
        env = stack_env(redis_server.url, sandbox.url, broker.bootstrap_servers)
        os.environ.update(env)
        from captcha_tasks import kafka_client

        kafka_client.create_topics(partitions=args.partitions)
        procs.append(CeleryProcess("worker", env=env, concurrency=CONCURRENCY, log_dir=log_dir))
        procs[-1].start()
        procs.append(BridgeProcess("bridge", env, log_dir))
        procs[-1].start()
        return run(args, sandbox)
    finally:
        for proc in reversed(procs):
            proc.stop()
        sandbox.stop()
        print(f"\nlogs: {log_dir}")


def stack_env(redis_url: str, sandbox_url: str, bootstrap: str) -> dict[str, str]:
    return {
        "REDIS_URL": redis_url,
        "CAPTCHAAI_BASE_URL": sandbox_url,
        "CAPTCHAAI_API_KEY": KEY,
        "CAPTCHAAI_THREADS": str(THREADS),
        "CAPTCHAAI_POLL_INTERVAL": "0.25",
        "CAPTCHAAI_INITIAL_WAIT": "0.05",
        "CAPTCHAAI_KEY_PREFIX": "bench-kafka",
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "KAFKA_TASKS_TOPIC": "bench-tasks",
        "KAFKA_RESULTS_TOPIC": "bench-results",
        "KAFKA_DEAD_LETTER_TOPIC": "bench-dead-letter",
        "KAFKA_FEEDBACK_TOPIC": "bench-feedback",
        "KAFKA_GROUP_ID": "bench-bridge",
    }


class Results:
    """Reads the results topic from its end (no group), by task id."""

    def __init__(self) -> None:
        from captcha_tasks.kafka.client import Consumer, TopicPartition, consumer_config
        from captcha_tasks.settings import get_settings

        settings = get_settings()
        self.topic = settings.kafka.results_topic
        self.consumer = Consumer(consumer_config(settings, group=f"bench-{uuid.uuid4().hex}"))
        partitions = self.consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions
        ends = [
            self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
            for p in partitions
        ]
        self.consumer.assign(
            [TopicPartition(self.topic, p, end) for p, end in zip(partitions, ends, strict=True)]
        )
        self.seen: dict[str, float] = {}

    def wait_for(self, task_ids: set[str], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not task_ids <= self.seen.keys():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(task_ids - self.seen.keys())} results missing")
            for message in self.consumer.consume(500, 0.005):
                if message.error() is None:
                    result = json.loads(message.value() or b"{}")
                    self.seen.setdefault(result["task_id"], time.monotonic())

    def close(self) -> None:
        self.consumer.close()


def run(args: Any, sandbox: SandboxServer) -> int:
    from captcha_tasks import solve
    from captcha_tasks.kafka.client import TaskProducer

    producer = TaskProducer()
    results = Results()
    try:
        warm_up(producer, results, solve)
        bridge_s = bridge_throughput(producer, results, args.tasks)
        direct_s = direct_throughput(solve, args.tasks)
        direct, bridged = latencies(producer, results, solve, args.samples)
    finally:
        results.close()
    limiter = LimiterConfig(capacity=THREADS, reserve=0, lease_s=60)
    budget = limiter.in_per_window / limiter.in_window_s
    print(
        f"\nKafka bridge benchmark: sandbox solve_time 0, {THREADS} threads; one worker "
        f"(-P threads -c {CONCURRENCY}), one bridge, {args.partitions} partitions"
    )
    print(f"\n{'throughput':<28} {'tasks':>6} {'seconds':>8} {'tasks/s':>8}")
    for name, seconds in (("through the bridge", bridge_s), ("direct solve.delay", direct_s)):
        print(f"{name:<28} {args.tasks:>6} {seconds:>8.2f} {args.tasks / seconds:>8.1f}")
    print(
        f"(both are capped by the thread limiter's in.php budget: {limiter.in_per_window} "
        f"per {limiter.in_window_s:g} s = {budget:.0f}/s)"
    )
    print(f"\n{'latency, sequential':<28} {'n':>6} {'p50 ms':>8} {'p99 ms':>8}")
    rows = (
        ("direct solve.delay().get()", direct),
        ("enqueue -> result topic", bridged),
    )
    for name, samples in rows:
        print(f"{name:<28} {len(samples):>6} {pct(samples, 50):>8.1f} {pct(samples, 99):>8.1f}")
    added50 = pct(bridged, 50) - pct(direct, 50)
    added99 = pct(bridged, 99) - pct(direct, 99)
    print(f"{'added by the bridge':<28} {'':>6} {added50:>8.1f} {added99:>8.1f}")
    stats = sandbox.stats()
    print(f"\nsandbox: {stats['submits']} submits, {stats['thread_rejections']} rejections")
    return 0


def warm_up(producer: Any, results: Results, solve: Any) -> None:
    for _ in range(10):
        solve.delay(method="turnstile", sitekey="k", pageurl=PAGE).get(timeout=60)
        one_through_bridge(producer, results)


def one_through_bridge(producer: Any, results: Results) -> float:
    task_id = uuid.uuid4().hex
    started = time.monotonic()
    producer.enqueue(task_id, "turnstile", "k", PAGE)
    producer.flush()
    results.wait_for({task_id})
    return results.seen[task_id] - started


def bridge_throughput(producer: Any, results: Results, count: int) -> float:
    ids = {uuid.uuid4().hex for _ in range(count)}
    started = time.monotonic()
    for task_id in ids:
        producer.enqueue(task_id, "turnstile", "k", PAGE)
    producer.flush()
    results.wait_for(ids, timeout=600)
    return max(results.seen[i] for i in ids) - started


def direct_throughput(solve: Any, count: int) -> float:
    started = time.monotonic()
    pending = [solve.delay(method="turnstile", sitekey="k", pageurl=PAGE) for _ in range(count)]
    for result in pending:
        result.get(timeout=600)
    return time.monotonic() - started


def latencies(
    producer: Any, results: Results, solve: Any, samples: int
) -> tuple[list[float], list[float]]:
    direct: list[float] = []
    bridged: list[float] = []
    for _ in range(samples):
        started = time.monotonic()
        solve.delay(method="turnstile", sitekey="k", pageurl=PAGE).get(timeout=60)
        direct.append(time.monotonic() - started)
        bridged.append(one_through_bridge(producer, results))
    return direct, bridged


def pct(samples: list[float], q: int) -> float:
    """The q-th percentile in milliseconds."""
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0] * 1000
    return statistics.quantiles(ordered, n=100, method="inclusive")[q - 1] * 1000


if __name__ == "__main__":
    sys.exit(main())

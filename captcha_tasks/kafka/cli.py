"""``captcha-tasks kafka-bridge`` and ``captcha-tasks kafka ...``: thin wrappers over
:mod:`captcha_tasks.kafka.bridge` and :mod:`captcha_tasks.kafka.client`.

They need the ``kafka`` extra; without confluent-kafka they stop with one line saying how
to install it.  This module imports neither at import time, so ``captcha-tasks --help``
lists them without it: the imports inside the commands are of the optional dependency.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType

import click


@click.command("kafka-bridge")
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    default=None,
    help="Unfinished tasks before partitions pause (default: KAFKA_MAX_IN_FLIGHT).",
)
@click.option(
    "--drain-timeout",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds to finish in-flight tasks on SIGTERM before leaving the group.",
)
@click.option("--log-level", default="INFO", show_default=True)
def kafka_bridge(max_in_flight: int | None, drain_timeout: float, log_level: str) -> None:
    """Solve the tasks of KAFKA_TASKS_TOPIC through the workers; publish one outcome per
    task to KAFKA_RESULTS_TOPIC (failures also to KAFKA_DEAD_LETTER_TOPIC)."""
    from ..worker.app import app
    from ..worker.redact import configure_logging
    from .bridge import run_bridge  # optional dependency: confluent-kafka

    configure_logging(log_level, app.settings, "%(asctime)s %(levelname)s %(name)s: %(message)s")

    runtime = app.runtime()
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger(__name__).info("signal %d: draining and leaving the group", signum)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    run_bridge(
        runtime.settings,
        runtime.state,
        stop=stop,
        max_in_flight=max_in_flight,
        drain_timeout=drain_timeout,
    )


@click.group("kafka")
def kafka() -> None:
    """Kafka helpers: consumer lag and topics."""


@kafka.command("lag")
@click.option("--group", default=None, help="Consumer group (default: KAFKA_GROUP_ID).")
@click.option("--topic", default=None, help="Topic (default: KAFKA_TASKS_TOPIC).")
@click.option(
    "--max-lag",
    type=click.IntRange(min=0),
    default=None,
    help="Exit with status 1 when the group's total lag is above N (for cron alerts).",
)
def lag(group: str | None, topic: str | None, max_lag: int | None) -> None:
    """Print the group's lag per partition of the tasks topic, and the total."""
    from .client import consumer_lag, total_lag  # optional dependency: confluent-kafka

    lags = consumer_lag(group=group, topic=topic)
    click.echo(f"{'partition':>9} {'committed':>10} {'end':>10} {'lag':>8}")
    for item in lags:
        committed = "-" if item.committed is None else str(item.committed)
        click.echo(f"{item.partition:>9} {committed:>10} {item.end:>10} {item.lag:>8}")
    total = total_lag(lags)
    click.echo(f"{'total':>9} {'':>10} {'':>10} {total:>8}")
    if max_lag is not None and total > max_lag:
        click.echo(f"lag {total} is above --max-lag {max_lag}", err=True)
        sys.exit(1)


@kafka.command("create-topics")
@click.option("--partitions", type=click.IntRange(min=1), default=6, show_default=True)
@click.option("--replication-factor", type=click.IntRange(min=1), default=1, show_default=True)
def create_topics(partitions: int, replication_factor: int) -> None:
    """Create the tasks, results, dead-letter and feedback topics (existing ones are left
    alone)."""
    from .client import create_topics as create  # optional dependency: confluent-kafka

    created = create(partitions=partitions, replication_factor=replication_factor)
    click.echo(f"created: {', '.join(created)}" if created else "all topics exist already")

"""The Redis broker transport, with one fault of kombu's closed.

When the broker connection drops (Redis restarts, fails over), Celery's consumer closes
the connection and kombu's Redis channel then tries to put the worker's unacknowledged
messages back on their queues through a client built from the connection it has just
released: ``AttributeError: 'NoneType' object has no attribute 'hostname'`` (see
celery/kombu#582 and #970 for the same path).  Celery counts that as an unrecoverable
error and the worker exits instead of reconnecting.

The same released connection breaks the acknowledgement of a task that finished just
then (``'NoneType' object has no attribute 'client'``).

Here both are skipped when they cannot run: the messages stay in kombu's ``unacked``
hash, and every worker's consumer puts them back once their visibility timeout passes
(``unacked_restore_interval``), as it does for a worker that was killed; a task run again
finds its work done (every step is idempotent).  Everything else is kombu's Redis
transport as it is.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis as kombu_redis

log = logging.getLogger(__name__)

#: ``broker_transport`` of our Celery app (schemes ``redis://`` and ``rediss://``).
TRANSPORT = "captcha_tasks.worker.broker:Transport"


class QoS(kombu_redis.QoS):
    def restore_unacked(self, client: Any = None) -> Any:
        try:
            return super().restore_unacked(client)  # type: ignore[no-untyped-call]
        except AttributeError:  # the connection was released under us: see the module doc
            log.warning(
                "broker connection lost: %d unacknowledged message(s) return after the"
                " visibility timeout",
                len(self._delivered),
            )
            return None

    def ack(self, delivery_tag: Any) -> None:
        try:
            super().ack(delivery_tag)  # type: ignore[no-untyped-call]
        except AttributeError:  # the connection was released under us: see the module doc
            log.warning("broker connection lost: a message returns after the visibility timeout")

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        try:
            super().reject(delivery_tag, requeue=requeue)  # type: ignore[no-untyped-call]
        except AttributeError:  # the connection was released under us: see the module doc
            log.warning("broker connection lost: a message returns after the visibility timeout")


class Channel(kombu_redis.Channel):
    QoS = QoS


class Transport(kombu_redis.Transport):
    Channel = Channel

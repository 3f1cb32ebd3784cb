"""kombu's Redis broker transports (one Redis, and Redis behind Sentinel) with one fault of
kombu's closed, the result backend each uses (:mod:`.backend`: ``get()`` waits out an
outage), and the Sentinel one on connections that follow the master.

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
transport (or its ``sentinel`` transport: a failover drops the same connections) as it is.

Behind Sentinel the broker's and the result backend's connections are
:class:`~captcha_tasks.state.connections.MasterFollowingConnection`: after a graceful
``SENTINEL FAILOVER`` they move to the new master within about a second instead of
staying on the old one (still answering, its writes later thrown away) until the
sentinels demote it.  kombu holds one connection for ``BRPOP`` and polls its socket, so
there a move fails the command and the consumer reconnects, as after a dropped connection.

kombu and Celery internals this module depends on (each marked ``kombu:`` or ``Celery:``
where it is used): the Redis transport's ``QoS`` (``restore_unacked``, ``ack``,
``reject``: the unacknowledged-message bookkeeping in the ``unacked`` hash), its
``Channel.QoS`` and ``Transport.Channel`` hooks, the Sentinel channel's
``connection_class`` / ``connection_class_ssl``, and the Sentinel result backend's
``_get_pool``.  Which class a URL selects is :mod:`captcha_tasks.worker.broker`'s.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.backends import redis as celery_redis
from kombu.transport import redis as kombu_redis

from ...state.connections import (
    MasterFollowingConnection,
    MasterFollowingSSLConnection,
    following_connection,
)
from .backend import OutageSafe

log = logging.getLogger(__name__)


class QoS(kombu_redis.QoS):
    # kombu: the Redis channel's QoS keeps delivered messages in the unacked hash; these
    # three methods reach the Redis client of a connection that may be released already.
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
    QoS = QoS  # kombu: the channel builds its QoS from this attribute


class Transport(kombu_redis.Transport):
    Channel = Channel  # kombu: the transport builds its channels from this attribute


class _BrokerConnection(MasterFollowingConnection):
    raise_on_move = True


class _BrokerSSLConnection(MasterFollowingSSLConnection):
    raise_on_move = True


class SentinelChannel(kombu_redis.SentinelChannel):
    QoS = QoS
    # kombu: the Sentinel channel connects to the master it asks the sentinels for with
    # these classes.
    connection_class = _BrokerConnection
    connection_class_ssl = _BrokerSSLConnection  # type: ignore[assignment]


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


class SentinelBackend(OutageSafe, celery_redis.SentinelBackend):
    """Celery's Redis Sentinel result backend, on connections that follow the master, whose
    ``get()`` waits out an outage (:class:`.backend.OutageSafe`)."""

    def _get_pool(self, **params: Any) -> Any:
        # Celery: the Sentinel backend builds its connection pool here, from the master
        # the sentinels name.
        tls = params.get("connection_class") is self.connection_class_ssl
        return super()._get_pool(**{**params, "connection_class": following_connection(tls)})


def priority_lists(queue: str) -> list[tuple[int, str]]:
    """The Redis lists kombu keeps ``queue``'s messages in: (priority step, list name)."""
    # kombu: the Redis transport keeps a message sent with a priority in the list
    # <queue><Channel.sep><step> (PRIORITY_STEPS); step 0 is the queue itself.
    return [
        (step, queue if not step else f"{queue}{kombu_redis.Channel.sep}{step}")
        for step in kombu_redis.PRIORITY_STEPS
    ]

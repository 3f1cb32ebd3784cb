"""What every object of the state layer talks to: one Redis client and the key names.

A Redis that does not answer turns into :class:`~captcha_tasks.errors.StoreUnavailable`
(:meth:`Db.guard`), whose message names where that Redis was looked for (``REDIS_URL``,
password masked): the callers fail closed with a clear error, never a raw redis-py one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from ..errors import StoreUnavailable
from .connections import UNREACHABLE, ReplicaFence, describe
from .keys import Keys
from .lua import Bound, Chain, Script

T = TypeVar("T")


@dataclass(frozen=True)
class Db:
    """A Redis client and the key names of one deployment."""

    redis: redis.Redis
    keys: Keys
    #: Behind Sentinel: when a write money follows must reach a replica first.
    fence: ReplicaFence | None = None

    def guard(self, call: Callable[[], T], what: str = "") -> T:
        """Run a Redis call; an unreachable Redis fails closed with a clear error."""
        try:
            return call()
        except UNREACHABLE as exc:
            raise self.unavailable(exc, what) from None

    def unavailable(self, exc: BaseException, what: str = "") -> StoreUnavailable:
        """The error for a Redis call that failed with ``exc``: where Redis was looked for
        (password masked), redis-py's reason, and ``what`` that means for the caller."""
        suffix = f": {what}" if what else ""
        return StoreUnavailable(
            f"Redis is down or REDIS_URL is wrong (REDIS_URL={describe(self.redis)}; "
            f"{type(exc).__name__}: {exc})" + suffix
        )

    def bind(self, script: Script) -> Bound:
        """Register ``script`` on this client (once per object that runs it)."""
        return script.bind(self.redis)

    def fenced(self, write: Callable[[Any], Any]) -> tuple[Any, bool]:
        """Run ``write`` (given a client or pipeline to queue on) and say whether a replica
        holds it: ``(reply, True)`` also when no replica could take over (see
        :class:`~captcha_tasks.state.connections.ReplicaFence`).  Unguarded: the caller guards."""
        if self.fence is None or not self.fence.needed():
            return write(self.redis), True
        pipe = self.redis.pipeline(transaction=False)  # WAIT must follow on its connection
        write(pipe)
        pipe.execute_command(*self.fence.wait_command())  # type: ignore[no-untyped-call]
        reply, acknowledged = pipe.execute()
        return reply, int(acknowledged) >= 1

    def chain(self) -> Chain:
        """Script calls to send in one round trip (see :class:`~.lua.Chain`)."""
        return Chain(self.redis)

    def run_chain(self, chain: Chain, fenced: bool = False) -> tuple[list[Any], bool]:
        """Run ``chain`` (each group's value) and, when ``fenced``, say whether a replica
        holds what it wrote (see :meth:`fenced`).  Unguarded: the caller guards."""
        if not fenced or self.fence is None or not self.fence.needed():
            return chain.execute()[0], True
        values, (acknowledged,) = chain.execute(self.fence.wait_command())
        return values, int(acknowledged) >= 1

    def pipeline(self) -> Any:
        return self.redis.pipeline(transaction=False)

    def ping(self) -> None:
        """Raise :class:`StoreUnavailable` unless Redis answers."""
        self.guard(self.redis.ping, "nothing was sent")

"""The gateway's state in Redis: the captcha ids it issues, what each one stands for, and
its counters.

* **Ids.**  A provider's SDK expects a number: the gateway hands out the next value of one
  counter per deployment (``INCR``; far below 2^53, so a JavaScript client reads it
  exactly), whichever gateway process answers.
* **What an id stands for** (:class:`Ticket`): the tenant that submitted it, and the
  ``solve``'s task id (its outcome is read from the result backend) or, for a token taken
  from a pool at once, the outcome itself.  Kept as long as the result backend keeps
  outcomes.  No key is stored: the tenant is named.  A client's own callback URL is kept
  in it too (:attr:`Ticket.callback`), for the worker that delivers the answer there.
* **Counters** for the metrics exporter: requests and errors by tenant, protocol and
  endpoint, and a histogram of the time an answer took (:class:`GatewayStats`).  A gateway
  adds its counts up in memory and writes them at most once a second, so counting costs a
  request no Redis round trip.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import StoreUnavailable
from .db import Db
from .lua import text

T = TypeVar("T")

#: Upper bounds (seconds) of the answer-time histogram's buckets (the last one: +Inf).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
#: Seconds a gateway keeps its counts in memory before writing them.
FLUSH_EVERY_S = 1.0
#: What an id stands for never changes: a gateway keeps the tickets it read for this long
#: (at most this many), so that a client's polls cost one Redis round trip, not two.
TICKETS_KEPT_S = 60.0
TICKETS_KEPT = 100_000


@dataclass(frozen=True)
class Ticket:
    """What a gateway captcha id stands for."""

    tenant: str
    method: str
    #: The solve's task id (None: answered from a pool, see ``outcome``).
    task_id: str | None = None
    #: The outcome of a token taken from a pool at submit.
    outcome: Mapping[str, Any] | None = None
    #: The client's own callback URL (``pingback``, ``callbackUrl``; not a secret), and
    #: the face that took it (``in.php`` or ``json``): how the answer is sent there.
    callback: str | None = None
    face: str | None = None

    def to_json(self) -> str:
        data: dict[str, Any] = {"tenant": self.tenant, "method": self.method}
        if self.task_id is not None:
            data["task"] = self.task_id
        if self.outcome is not None:
            data["outcome"] = dict(self.outcome)
        if self.callback is not None:
            data["callback"], data["face"] = self.callback, self.face
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> Ticket:
        data = json.loads(raw)
        return cls(
            data["tenant"],
            data["method"],
            data.get("task"),
            data.get("outcome"),
            data.get("callback"),
            data.get("face"),
        )


class GatewayTickets:
    """Ids and what they stand for (thread-safe)."""

    def __init__(self, db: Db, clock: Callable[[], float] = time.monotonic) -> None:
        self.db = db
        self.keys = db.keys
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, tuple[float, Ticket]] = OrderedDict()

    def issue(self, ticket: Ticket, ttl_s: int) -> str:
        """A new id standing for ``ticket`` (for ``ttl_s`` seconds)."""
        r = self.db.redis
        captcha_id = str(self._guarded(lambda: r.incr(self.keys.gateway_ids())))
        key = self.keys.gateway_captcha(captcha_id)
        self._guarded(lambda: r.set(key, ticket.to_json(), ex=ttl_s))
        self._keep(captcha_id, ticket)
        return captcha_id

    def look_up(self, captcha_ids: Sequence[str]) -> list[Ticket | None]:
        """What each of ``captcha_ids`` stands for (None: an id never issued, or forgotten)."""
        found = self._kept_ones(captcha_ids)
        missing = [i for i in captcha_ids if i not in found]
        if missing:
            keys = [self.keys.gateway_captcha(i) for i in missing]
            raws = self._guarded(lambda: self.db.redis.mget(keys))
            for captcha_id, raw in zip(missing, raws, strict=True):
                if raw is not None:
                    found[captcha_id] = self._keep(captcha_id, Ticket.from_json(text(raw)))
        return [found.get(i) for i in captcha_ids]

    def _kept_ones(self, captcha_ids: Sequence[str]) -> dict[str, Ticket]:
        now = self._clock()
        found = {}
        with self._lock:
            for captcha_id in captcha_ids:
                kept = self._kept.get(captcha_id)
                if kept is not None and kept[0] > now:
                    found[captcha_id] = kept[1]
        return found

    def _keep(self, captcha_id: str, ticket: Ticket) -> Ticket:
        with self._lock:
            self._kept[captcha_id] = (self._clock() + TICKETS_KEPT_S, ticket)
            self._kept.move_to_end(captcha_id)
            while len(self._kept) > TICKETS_KEPT:
                self._kept.popitem(last=False)
        return ticket

    def records(self, keys: Sequence[str]) -> list[str | None]:
        """The values of ``keys`` (the result backend's records of solves), in one round
        trip."""
        if not keys:
            return []
        raws = self._guarded(lambda: self.db.redis.mget(list(keys)))
        return [None if raw is None else text(raw) for raw in raws]

    def _guarded(self, call: Callable[[], T]) -> T:
        return self.db.guard(call, "the gateway cannot answer")


@dataclass(frozen=True)
class Requests:
    """A gateway's requests for one tenant, protocol and endpoint."""

    requests: int = 0
    #: Errors by code.
    errors: Mapping[str, int] = field(default_factory=dict)
    #: Answer times: counts per bucket of :data:`LATENCY_BUCKETS` (and one past the last).
    buckets: tuple[int, ...] = (0,) * (len(LATENCY_BUCKETS) + 1)
    seconds: float = 0.0


class GatewayStats:
    """The gateway's counters: added up in memory (thread-safe), written at most once per
    :data:`FLUSH_EVERY_S` by :meth:`count`'s caller thread, read by the exporter."""

    def __init__(self, db: Db, clock: Callable[[], float] = time.monotonic) -> None:
        self.db = db
        self.keys = db.keys
        self._clock = clock
        self._lock = threading.Lock()
        #: Held while a flush writes: a flush returns once every earlier one has written.
        self._writing = threading.Lock()
        self._pending: Counter[str] = Counter()
        self._seconds: dict[str, float] = {}
        self._flushed_at = clock()

    def count(
        self, tenant: str, protocol: str, endpoint: str, error: str | None, seconds: float
    ) -> None:
        """Count one request (``error``: the code it was answered with, if any)."""
        where = f"{tenant}|{protocol}|{endpoint}"
        bucket = next(
            (i for i, b in enumerate(LATENCY_BUCKETS) if seconds <= b), len(LATENCY_BUCKETS)
        )
        with self._lock:
            self._pending[f"requests|{where}"] += 1
            if error is not None:
                self._pending[f"errors|{where}|{error}"] += 1
            self._pending[f"bucket|{where}|{bucket}"] += 1
            name = f"seconds|{where}"
            self._seconds[name] = self._seconds.get(name, 0.0) + seconds
            due = self._clock() - self._flushed_at >= FLUSH_EVERY_S
        if due:
            self.flush()

    def flush(self) -> bool:
        """Write the counts kept in memory; False when Redis is away (they are kept for
        the next try: counting never fails a request).  Every request counted before the
        call is in Redis when it returns True, even while another thread's flush (one a
        request made due) is writing: a shutdown, or a reader, never sees a count that is
        on its way."""
        with self._writing:
            return self._write()

    def _write(self) -> bool:
        with self._lock:
            counts, seconds = self._pending, self._seconds
            self._pending, self._seconds = Counter(), {}
            self._flushed_at = self._clock()
        if not counts:
            return True
        pipe = self.db.pipeline()
        for name, n in counts.items():
            pipe.hincrby(self.keys.gateway_stats(), name, n)
        for name, s in seconds.items():
            pipe.hincrbyfloat(self.keys.gateway_stats(), name, s)
        try:
            self.db.guard(pipe.execute)
        except StoreUnavailable:
            with self._lock:
                self._pending.update(counts)
                for name, s in seconds.items():
                    self._seconds[name] = self._seconds.get(name, 0.0) + s
            return False
        return True

    def read(self) -> dict[tuple[str, str, str], Requests]:
        """Every tenant's, protocol's and endpoint's counts so far."""
        raw = self.db.guard(lambda: self.db.redis.hgetall(self.keys.gateway_stats()))
        return _tabulate((text(k), text(v)) for k, v in raw.items())


def _tabulate(items: Iterable[tuple[str, str]]) -> dict[tuple[str, str, str], Requests]:
    found: dict[tuple[str, str, str], dict[str, Any]] = {}
    width = len(LATENCY_BUCKETS) + 1
    for name, value in items:
        kind, _, rest = name.partition("|")
        parts = rest.split("|")
        if len(parts) < 3:
            continue
        where = (parts[0], parts[1], parts[2])
        row = found.setdefault(
            where, {"requests": 0, "errors": {}, "buckets": [0] * width, "seconds": 0.0}
        )
        if kind == "requests":
            row["requests"] = int(value)
        elif kind == "errors" and len(parts) == 4:
            row["errors"][parts[3]] = int(value)
        elif kind == "bucket" and len(parts) == 4 and parts[3].isdigit():
            row["buckets"][min(int(parts[3]), width - 1)] = int(value)
        elif kind == "seconds":
            row["seconds"] = float(value)
    return {
        where: Requests(row["requests"], row["errors"], tuple(row["buckets"]), row["seconds"])
        for where, row in sorted(found.items())
    }

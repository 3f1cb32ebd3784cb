"""A circuit per provider, shared through Redis: whether it is in rotation.

A provider's circuit *opens* (the provider is out of rotation for every worker) on
``threshold`` consecutive transport errors (no answer, HTTP 5xx, a timeout), and at once on
an empty balance (``ERROR_ZERO_BALANCE``) or a key it refuses.  While it is open, nothing is
admitted there (the limiter's admission reads it), and housekeeping sends a cheap probe
(``getbalance``) on a back-off: the first good answer *closes* it.  The transition is
returned to the one process that made it, which logs it: one line when a circuit opens,
one when it closes.

A process reads every circuit at once (:meth:`Circuits.view`) and reuses what it read for
:data:`FRESH_FOR_S`; the limiter's own check keeps a stale view from admitting anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from ..core.health import Circuit, Counted, Why
from .db import Db
from .lua import Script, ms, text

T = TypeVar("T")

#: Seconds a process reuses the circuits it read.
FRESH_FOR_S = 0.2
#: The first probe of an open circuit comes this long after it opened; each next one
#: waits twice as long, up to :data:`PROBE_MAX_S`.
PROBE_FIRST_S = 1.0
PROBE_MAX_S = 10.0
BALANCE_CODE = "ERROR_ZERO_BALANCE"

FAIL = Script("circuits/fail")
SUCCEEDED = Script("circuits/succeeded")
PROBE_DUE = Script("circuits/probe_due")
PROBED = Script("circuits/probed")


class Circuits:
    """Every provider's circuit (``names``: the providers, the primary first)."""

    def __init__(
        self,
        db: Db,
        names: Sequence[str],
        threshold: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.keys = db.keys
        self.names = tuple(names)
        self.threshold = threshold
        self._clock = clock
        self._fail = db.bind(FAIL)
        self._succeeded = db.bind(SUCCEEDED)
        self._probe_due = db.bind(PROBE_DUE)
        self._probed = db.bind(PROBED)
        self._view: tuple[float, dict[str, Circuit]] | None = None

    def _key(self, provider: str) -> dict[str, str]:
        return {"circuit": self.keys.circuit(provider)}

    def failed(self, provider: str, code: str, why: Why) -> Counted:
        """Count a failed request at ``provider``: whether its circuit is open now, and
        whether this call opened it."""
        args = {
            "code": code,
            "why": why,
            "threshold": self.threshold,
            "probe_ms": ms(PROBE_FIRST_S),
        }
        reply = int(self._guarded(lambda: self._fail(self._key(provider), args)))
        # Read afresh next time, counted or opened: what the next answer asks of the
        # circuit is decided from its failures as counted (core.health.on_request).
        self._view = None
        return Counted(open=reply > 0, opened=reply == 1)

    def succeeded(self, provider: str) -> None:
        """A request was answered: consecutive failures start from 0 again."""
        self._guarded(lambda: self._succeeded(self._key(provider)))

    def probes_due(self) -> list[str]:
        """The providers to probe now (each taken by one process; one round trip)."""
        args = {"first_ms": ms(PROBE_FIRST_S), "max_ms": ms(PROBE_MAX_S)}
        chain = self.db.chain()
        for name in self.names:
            chain.add(
                lambda replies: int(replies[0]) == 1, self._probe_due.call(self._key(name), args)
            )
        due, _ = self._guarded(lambda: self.db.run_chain(chain))
        return [name for name, probe in zip(self.names, due, strict=True) if probe]

    def probed(
        self, provider: str, ok: bool, balance: float | None = None, code: str | None = None
    ) -> bool:
        """Record a probe's (or a balance check's) answer; True when it closed the circuit."""
        args: dict[str, object] = {"ok": ok}
        if balance is not None:
            args["balance"] = repr(float(balance))
        if code is not None:
            args["code"] = code
        closed = bool(self._guarded(lambda: self._probed(self._key(provider), args)))
        if closed:
            self._view = None
        return closed

    def reset(self, *providers: str) -> None:
        """Put providers back in rotation now, forgetting their circuits (default: every
        one): an operator who fixed what took them out need not wait for a probe."""
        keys = [self.keys.circuit(name) for name in providers or self.names]
        self._guarded(lambda: self.db.redis.delete(*keys))
        self._view = None

    def saw_balance(self, provider: str, balance: float) -> None:
        """Keep a balance a periodic check read (the circuit stays as it is)."""
        args = {"ok": False, "balance": repr(float(balance))}
        self._guarded(lambda: self._probed(self._key(provider), args))

    def view(self) -> dict[str, Circuit]:
        """Every circuit, as read at most :data:`FRESH_FOR_S` ago by this process."""
        now = self._clock()
        cached = self._view
        if cached is not None and now - cached[0] < FRESH_FOR_S:
            return cached[1]
        found = self.read()
        self._view = (now, found)
        return found

    def forget(self) -> None:
        """Read the circuits afresh next time."""
        self._view = None

    def read(self) -> dict[str, Circuit]:
        """Every circuit, read now."""
        pipe = self.db.pipeline()
        for name in self.names:
            pipe.hgetall(self.keys.circuit(name))
        raw = self._guarded(pipe.execute)
        return {name: _circuit(name, fields) for name, fields in zip(self.names, raw, strict=True)}

    def _guarded(self, call: Callable[[], T]) -> T:
        return self.db.guard(call, "the providers' circuits are unavailable")


def _circuit(provider: str, raw: dict[object, object]) -> Circuit:
    fields = {text(k): text(v) for k, v in raw.items()}

    def seconds(name: str) -> float | None:
        value = fields.get(name)
        return int(value) / 1000 if value else None

    balance = fields.get("balance")
    return Circuit(
        provider=provider,
        open=fields.get("state") == "open",
        why=fields.get("why"),
        code=fields.get("code"),
        failures=int(fields.get("failures") or 0),
        opened_at=seconds("opened_ms"),
        closed_at=seconds("closed_ms"),
        probe_at=seconds("probe_ms"),
        last_error=fields.get("error"),
        last_error_at=seconds("error_ms"),
        balance=float(balance) if balance else None,
        balance_at=seconds("balance_ms"),
    )

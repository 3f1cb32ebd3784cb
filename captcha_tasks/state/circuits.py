"""A circuit per provider, shared through Redis: whether it is in rotation.

A provider's circuit *opens* (the provider is out of rotation for every worker) on
``threshold`` consecutive transport errors (no answer, HTTP 5xx, a timeout), and at once on
an empty balance (``ERROR_ZERO_BALANCE``) or a key it refuses.  While it is open, nothing is
admitted there (the limiter's ``ADMIT`` reads it), and housekeeping sends a cheap probe
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

FAIL = Script(
    """
-- A request to the provider failed.  Counts a consecutive transport failure, or opens the
-- circuit at once for a hard one (an empty balance, a refused key).
-- K.circuit (hash: state, why, code, failures, opened_ms, probe_ms, probes, error,
--   error_ms, balance, balance_ms, closed_ms)
-- A.code = the error's code, A.why = 'soft' | 'balance' | 'key', A.threshold = consecutive
--   soft failures that open it, A.probe_ms = ms until the first probe
-- returns 1 when this call opened the circuit, 2 when it was open already, else 0
""",
    keys=("circuit",),
    body="""
redis.call('HSET', K.circuit, 'error', A.code, 'error_ms', now)
if redis.call('HGET', K.circuit, 'state') == 'open' then return 2 end
local failures = redis.call('HINCRBY', K.circuit, 'failures', 1)
if A.why == 'soft' and failures < A.threshold then return 0 end
redis.call('HSET', K.circuit, 'state', 'open', 'why', A.why, 'code', A.code,
  'opened_ms', now, 'probe_ms', now + A.probe_ms, 'probes', 0)
return 1
""",
)

SUCCEEDED = Script(
    """
-- A request to the provider was answered: the consecutive failures start again from 0.
-- K.circuit (FAIL)
-- A (nothing)
-- returns 1
""",
    keys=("circuit",),
    body="""
if redis.call('HGET', K.circuit, 'state') ~= 'open' then
  redis.call('HSET', K.circuit, 'failures', 0)
end
return 1
""",
)

PROBE_DUE = Script(
    """
-- Housekeeping: take the probes that are due (the next one is scheduled at once, so one
-- process sends each).
-- K.circuits = the circuits of every provider, in A.names' order (a list)
-- A.names = the providers' names, A.first_ms, A.max_ms = the probe back-off
-- returns the names of the providers to probe now
""",
    more="circuits",
    body="""
local due = {}
for i, key in ipairs(K.circuits) do
  if redis.call('HGET', key, 'state') == 'open' then
    local at = tonumber(redis.call('HGET', key, 'probe_ms') or '0')
    if at <= now then
      local probes = tonumber(redis.call('HGET', key, 'probes') or '0')
      local wait = math.min(A.max_ms, A.first_ms * math.pow(2, probes + 1))
      redis.call('HSET', key, 'probe_ms', now + wait, 'probes', probes + 1)
      table.insert(due, A.names[i])
    end
  end
end
return due
""",
)

PROBED = Script(
    """
-- A probe (or a balance check) answered: a good answer closes the circuit.
-- K.circuit (FAIL)
-- A.ok = true for a good answer, A.balance = the balance it read (absent: none),
-- A.code = the error of a bad answer (absent: none)
-- returns 1 when this call closed the circuit, else 0
""",
    keys=("circuit",),
    body="""
if A.balance then redis.call('HSET', K.circuit, 'balance', A.balance, 'balance_ms', now) end
if not A.ok then
  if A.code then redis.call('HSET', K.circuit, 'error', A.code, 'error_ms', now) end
  return 0
end
local was = redis.call('HGET', K.circuit, 'state')
redis.call('HSET', K.circuit, 'state', 'closed', 'failures', 0)
if was == 'open' then
  redis.call('HSET', K.circuit, 'closed_ms', now)
  return 1
end
return 0
""",
)


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
        """The providers to probe now (each taken by one process)."""
        args = {"names": list(self.names), "first_ms": ms(PROBE_FIRST_S), "max_ms": ms(PROBE_MAX_S)}
        more = [self.keys.circuit(n) for n in self.names]
        reply = self._guarded(lambda: self._probe_due({}, args, more=more))
        return [text(name) for name in reply]

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

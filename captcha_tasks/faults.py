"""Fault points for crash and failure tests: a process misbehaves on purpose at a named point.

``CAPTCHAAI_FAULTS`` is a comma-separated list of ``[action@]point[*times]``:

* ``kill@handout`` (or just ``handout``): the process SIGKILLs itself there, at once and
  without cleanup;
* ``raise@in_php``: a ``RuntimeError`` is raised there (a bug);
* ``redis@register``: a ``redis.ConnectionError`` is raised there (Redis went away);
* ``*N`` fires the fault the first N times the point is reached in this process only.

The tests use them to prove that nothing Redis hands to a process lives only in its memory,
and that a solve never ends in silence.  Unset (always, outside tests), a point costs one
dictionary lookup.

Points: ``solve`` (a solve message, its job built), ``admit`` (a submit admitted),
``budget_wait`` (a submit holding its slot told to wait for a request budget, before its
slot is given back and its job deferred), ``in_php`` (before the ``in.php`` call),
``register`` (a captcha put on the board), ``poll`` (a poll round deciding about one
captcha), ``complete`` (a solve completed, before what follows the completion script),
``handout`` (after Redis handed a parked submit its thread, before the submit's message
is published) and ``retire`` (a failed captcha retired, before its next attempt's message
is published).
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass
from functools import lru_cache

import redis

FAULTS_ENV = "CAPTCHAAI_FAULTS"
ACTIONS = ("kill", "raise", "redis")
POINTS = frozenset(
    {
        "solve",
        "admit",
        "budget_wait",
        "in_php",
        "register",
        "poll",
        "complete",
        "handout",
        "retire",
    }
)


class InjectedFault(RuntimeError):
    """The ``raise`` action of a fault point (never raised in production)."""


@dataclass
class Fault:
    action: str
    #: Times left to fire (None: every time).
    left: int | None = None


def parse(spec: str) -> dict[str, Fault]:
    """The faults of a ``CAPTCHAAI_FAULTS`` value; ValueError naming a bad entry."""
    armed: dict[str, Fault] = {}
    for item in (p.strip() for p in spec.split(",")):
        if not item:
            continue
        action, _, rest = item.rpartition("@")
        point, _, times = rest.partition("*")
        action = action or "kill"
        if action not in ACTIONS or point not in POINTS or (times and not times.isdigit()):
            raise ValueError(f"{FAULTS_ENV}: bad fault {item!r}")
        armed[point] = Fault(action, int(times) if times else None)
    return armed


@lru_cache(maxsize=1)
def armed() -> dict[str, Fault]:
    """The fault points of this process."""
    return parse(os.environ.get(FAULTS_ENV, ""))


_lock = threading.Lock()


def point(name: str) -> None:
    """Misbehave here when ``name`` is armed (see the module docstring)."""
    fault = armed().get(name)
    if fault is None:
        return
    with _lock:
        if fault.left == 0:
            return
        if fault.left is not None:
            fault.left -= 1
    if fault.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.action == "redis":
        raise redis.ConnectionError(f"fault injected at {name}")
    else:
        raise InjectedFault(f"fault injected at {name}")

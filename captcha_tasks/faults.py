"""Fault points for crash tests: a process dies on purpose at a named point.

``CAPTCHAAI_FAULTS=handout`` makes a worker SIGKILL itself at the first ``handout`` point
it reaches: after Redis handed a parked submit its thread, before the submit's message
is published.  The crash tests use it to prove that nothing Redis hands to a process
lives only in that process's memory.  Unset (always, outside tests), a point costs one
set lookup.

Points: ``handout`` (see :meth:`~captcha_tasks.worker.completion.Completer.publish`) and
``retire`` (a failed captcha retired, before its next attempt's message is published).
"""

from __future__ import annotations

import os
import signal
from functools import lru_cache

FAULTS_ENV = "CAPTCHAAI_FAULTS"


@lru_cache(maxsize=1)
def armed() -> frozenset[str]:
    """The fault points this process dies at."""
    return frozenset(p.strip() for p in os.environ.get(FAULTS_ENV, "").split(",") if p.strip())


def point(name: str) -> None:
    """Die here, at once and without cleanup, when ``name`` is armed."""
    if name in armed():
        os.kill(os.getpid(), signal.SIGKILL)

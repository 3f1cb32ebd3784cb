"""RedBeat for a standby beat, riding out a Redis failover.

``celery -A captcha_tasks beat -S captcha_tasks.worker.beat:RedBeatScheduler`` (with the
``redbeat`` extra) is celery-redbeat's scheduler with one fault closed: RedBeat extends its
lock at the start of every tick without retrying, so the first tick that finds no master
(a kill -9 until a replica is promoted; a graceful switch when the sentinels cut the old
master's clients) stops beat (sibson/redbeat#285).  Here such a tick is tried again
shortly; the lock, kept by Redis with its timeout, is still ours when the new master
answers.  A lock that did expire (Redis away longer than ``redbeat_lock_timeout``) still
stops beat, as it must: a standby may hold it by then.
"""

from __future__ import annotations

import logging
from typing import Any

from redbeat import RedBeatScheduler as _RedBeatScheduler

from ..state.connections import UNREACHABLE

log = logging.getLogger(__name__)

#: Seconds before a tick that could not reach Redis is tried again.
RETRY_S = 1.0


class RedBeatScheduler(_RedBeatScheduler):
    def tick(self, *args: Any, **kwargs: Any) -> float:
        try:
            return float(super().tick(*args, **kwargs))
        except UNREACHABLE as exc:
            log.warning("beat: Redis unreachable (%s); ticking again in %g s", exc, RETRY_S)
            return RETRY_S

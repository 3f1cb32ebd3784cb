"""The Celery side of a deployment: its queues, the redelivery of a dead worker's
messages, and Flower."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..core.lanes import INTERACTIVE, LANES
from .declare import check, flag, setting

#: The Celery queues, one per kind of task, so a flood of one cannot starve the others;
#: solve messages have one per lane (interactive work keeps the plain ``solve`` queue).
QUEUE_KINDS = ("solve", "solve.bulk", "solve.background", "submit", "poll", "housekeeping")
_QUEUE_PREFIX = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


@dataclass(frozen=True)
class CelerySettings:
    """The queues and the message redelivery (``settings.celery``)."""

    queue_prefix: str = setting(
        "CAPTCHAAI_QUEUE_PREFIX",
        """prefix of the Celery queues (``<prefix>.solve``, ``.solve.bulk``,
        ``.solve.background``, ``.submit``, ``.poll``, ``.housekeeping``); two deployments
        sharing a Redis use different ones.""",
        "captcha",
    )
    visibility_timeout: float = setting(
        "CAPTCHAAI_VISIBILITY_TIMEOUT",
        """seconds before a dead worker's unacknowledged messages are delivered again
        (every countdown stays below half of it); a solve message that never starts is sent
        again 10 s after it, counted from the setting of the process that sent it (give
        callers the workers' value).""",
        60.0,
        parse=float,
    )
    flower_no_auth: bool = setting(
        "CAPTCHAAI_FLOWER_NO_AUTH",
        """let ``celery flower`` start without authentication (only behind a proxy that
        authenticates; see ``captcha_tasks.worker.flower_auth``).""",
        False,
        parse=flag,
    )

    def __post_init__(self) -> None:
        check(
            "CAPTCHAAI_QUEUE_PREFIX",
            bool(_QUEUE_PREFIX.fullmatch(self.queue_prefix)),
            "must be letters, digits, '.', '_' or '-'",
        )
        check("CAPTCHAAI_VISIBILITY_TIMEOUT", self.visibility_timeout >= 4, "must be >= 4")

    @property
    def queues(self) -> tuple[str, ...]:
        """The Celery queues of this deployment: solve, submit, poll, housekeeping."""
        return tuple(self.queue(kind) for kind in QUEUE_KINDS)

    def queue(self, kind: str) -> str:
        """The name of one of :data:`QUEUE_KINDS`."""
        return f"{self.queue_prefix}.{kind}"

    def solve_queue(self, lane: str = INTERACTIVE) -> str:
        """The queue of solve messages in ``lane`` (interactive: ``<prefix>.solve``)."""
        return self.queue("solve" if lane == INTERACTIVE else f"solve.{lane}")

    @property
    def solve_queues(self) -> tuple[str, ...]:
        """The solve queues of every lane."""
        return tuple(self.solve_queue(lane) for lane in LANES)

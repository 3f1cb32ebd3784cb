"""What the worker's adapter acts through: one :class:`Edges` per runner, shared by its
parts (:mod:`.admitting`, :mod:`.submitting`, :mod:`.rounds`, :mod:`.health`).

It holds the Celery app, the settings, the Redis state, the API clients, the task-event
sender, the steps' :class:`~captcha_tasks.core.decisions.Policy` and the one completion
path, and the few acts every part needs: end a solve that failed inside, read a method's
solve times, publish a poll round.  It decides nothing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError

from .. import errors
from ..core.answers import Answer
from ..core.decisions import Fail, Policy
from ..core.job import Job
from ..core.rounds import RoundDue
from ..core.timing import Timing
from ..methods import default_wait
from ..providers.inphp import ProviderAPI
from ..settings import Settings
from ..state import State
from ..state.connections import UNREACHABLE
from . import names
from .completion import Completer, Events

log = logging.getLogger(__name__)

#: An outage of Redis or the broker: not the end of a solve; its step is retried later.
OUTAGES = (errors.StoreUnavailable, OperationalError, *UNREACHABLE)
#: The attribute naming the step an exception was raised in (see :func:`at_step`).
STEP_ATTRIBUTE = "captcha_tasks_step"


@contextlib.contextmanager
def at_step(name: str) -> Iterator[None]:
    """Name the step in which an exception (no outage) is raised, for its error."""
    try:
        yield
    except OUTAGES:
        raise
    except Exception as exc:
        if not hasattr(exc, STEP_ATTRIBUTE):
            setattr(exc, STEP_ATTRIBUTE, name)
        raise


def policy(settings: Settings) -> Policy:
    """The settings the steps decide by."""
    return Policy(
        solve_timeout=settings.solving.solve_timeout,
        poll_interval=settings.solving.poll_interval,
        bulk_interval=settings.solving.bulk_window_s,
        transport_retries=settings.providers.transport_retries,
        max_resubmits=settings.solving.max_resubmits,
        token_lifetimes=dict(settings.solving.token_lifetimes),
        pingback_fallback=settings.pingback.fallback_poll if settings.pingback.enabled else None,
        overflow_after=settings.providers.overflow_after,
    )


@dataclass(frozen=True)
class Message:
    """The task message a step runs for: its id, and whether the broker delivered it again
    because the worker that had it died."""

    id: str
    redelivered: bool = False


class Edges:
    """The app, settings, state, API clients and completion one runner acts through.

    ``api`` gives a provider's API client (called with the provider's name, None for the
    primary, when a step needs it: only workers hold the keys); ``events`` sends a task
    event when a monitor (Flower) listens."""

    def __init__(
        self,
        app: Celery,
        settings: Settings,
        state: State,
        api: Callable[..., ProviderAPI],
        events: Events,
    ) -> None:
        self.app = app
        self.settings = settings
        self.state = state
        self.api = api
        self.events = events
        self.policy = policy(settings)
        self.completer = Completer(app, settings, state, events)
        self.results = self.completer.results

    def fail_inside(self, job: Job, exc: BaseException, step: str) -> None:
        """End ``job``'s solve with :class:`~captcha_tasks.errors.InternalError`: ``exc`` (no
        outage) was raised while ``step`` worked it.  The error names the exception's type,
        never its message (which could carry a proxy password)."""
        step = getattr(exc, STEP_ATTRIBUTE, step)
        log.error(
            "solve %s: %s in %s; it ends with ERROR_INTERNAL",
            job.solve_id,
            type(exc).__name__,
            step,
            exc_info=exc,
        )
        error = errors.InternalError(f"{type(exc).__name__} in {step}", captcha_id=job.captcha_id)
        self.completer.complete(job, Fail(error))

    def timing(self, job: Job) -> Timing:
        """When the job's method's captchas are worth polling, at its provider."""
        request = job.request
        default = default_wait(request.method, request.params)
        return self.state.provider(job.provider).solve_times.timing(request.method, default)

    def in_flight(self, job: Job, state: str, info: dict[str, Any]) -> tuple[str, str, int] | None:
        """The result record that says where a caller's solve is (key, record, TTL)."""
        if not job.for_caller:
            return None
        record = self.results.record(job.solve_id, state, info)
        return self.results.key(job.solve_id), record, self.results.ttl_s

    def count(self, *errs: errors.CaptchaTasksError | None, provider: str | None = None) -> None:
        """Count the errors' codes at ``provider`` (never breaks a solve)."""
        codes = [e.code for e in errs if e is not None]
        if codes:
            try:
                self.state.provider(provider).stats.count_errors(codes)
            except errors.StoreUnavailable:
                log.debug("could not count %s", codes)

    def count_cost(self, job: Job, answer: Answer) -> None:
        """Add what ``answer`` cost (where its provider said) to the job's provider and
        tenant (never breaks a solve)."""
        if answer.cost is None:
            return
        try:
            self.state.provider(job.provider).stats.add_cost(job.tenant_name, answer.cost)
        except errors.StoreUnavailable:
            log.debug("could not count a cost of %g", answer.cost)

    def publish_round(self, due: RoundDue | None, provider: str | None = None) -> None:
        """Send the poll round message a provider's board asked for.  A countdown longer
        than half the visibility timeout would be delivered twice: such a round runs early,
        finds nothing due and schedules the next."""
        if due is not None:
            countdown = min(due.countdown_s, self.settings.celery.visibility_timeout / 2)
            at = self.state.provider(provider)
            args: tuple[Any, ...] = (due.at_ms,) if at.spec.primary else (due.at_ms, at.name)
            self.app.send_task(
                names.POLL, args=args, countdown=countdown, argsrepr=f"(round {at.name})"
            )

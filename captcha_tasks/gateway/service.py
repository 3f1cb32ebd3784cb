"""What the gateway does for a tenant, whatever protocol the request came in: submit a
captcha, read answers, the balance, reports, the threads.  Both faces (:mod:`.inphp`,
:mod:`.jsonapi`) call these and only format what they return.

* A submit is a ``solve`` sent as ``solve.apply_async`` sends it (the same validation at
  the call site, secrets stashed, the message remembered), with the tenant's name and a
  lane; or, when a declared pool fits the request and has a token, that token at once
  (``take_token``: no worker hop).  Either way the client gets a new id
  (:class:`~captcha_tasks.state.gateway.GatewayTickets`).
* A submit with the client's own callback URL (``pingback``, ``callbackUrl``; judged by
  the face against the tenant's ``callback_hosts`` first) keeps it in the ticket and links
  the gateway's delivery task to the solve (``link`` and ``link_error``): the worker that
  completes the solve sends it, the way it runs any follow-up (owed in Redis until sent),
  and :mod:`.delivery` calls the client.
* An answer is read from the result backend (one ``MGET`` for any number of ids): nothing
  here waits for a solve.
* A tenant with a ``daily_captchas`` budget that is spent is refused at submit
  (:class:`BudgetSpent`), before anything is queued.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import errors
from ..core.lanes import Tenant
from ..methods import build_request
from ..state import State
from ..state.gateway import Ticket
from ..worker import names
from ..worker.app import app
from ..worker.callsite import normalize_solve_args
from ..worker.results import Results
from ..worker.tasks import report, solve, take_token

#: The faces a client callback comes in by (how the answer is sent to it).
IN_PHP_FACE, JSON_FACE = "in.php", "json"

#: Failures whose code only this package knows, as a provider would answer them: an SDK
#: knows what to do with these (try again, or top up).
_AS_PROVIDER = {
    "ERROR_BUDGET_EXCEEDED": "ERROR_ZERO_BALANCE",
    "ERROR_VALIDATION": "ERROR_BAD_PARAMETERS",
    "ERROR_NO_PROXY_AVAILABLE": "ERROR_PROXY_CONNECTION_FAILED",
    # the account's key is refused upstream: the tenant's key is fine, the service is not
    "ERROR_WRONG_USER_KEY": "ERROR_SERVER_ERROR",
    "ERROR_KEY_DOES_NOT_EXIST": "ERROR_SERVER_ERROR",
    "IP_BANNED": "ERROR_SERVER_ERROR",
    "ERROR_IP_NOT_ALLOWED": "ERROR_SERVER_ERROR",
}
#: Provider codes a failed solve is answered with as they are; any other code (ours:
#: timeouts, retries spent, revoked, internal) is an unsolvable captcha to the client.
_PROVIDER_CODES = frozenset(
    {
        "ERROR_CAPTCHA_UNSOLVABLE",
        "ERROR_ZERO_BALANCE",
        "ERROR_BAD_DUPLICATES",
        "ERROR_CAPTCHAIMAGE_BLOCKED",
        "ERROR_BAD_TOKEN_OR_PAGEURL",
        "ERROR_DOMAIN_NOT_ALLOWED",
        "ERROR_GOOGLEKEY",
        "ERROR_PAGEURL",
        "ERROR_BAD_PARAMETERS",
        "ERROR_ZERO_CAPTCHA_FILESIZE",
        "ERROR_TOO_BIG_CAPTCHA_FILESIZE",
        "ERROR_WRONG_FILE_EXTENSION",
        "ERROR_IMAGE_TYPE_NOT_SUPPORTED",
        "ERROR_PROXY_CONNECTION_FAILED",
        "ERROR_BAD_PROXY",
        "ERROR_SERVER_ERROR",
    }
)


def provider_code(code: str) -> str:
    """The error code a provider would answer for a solve that failed with ``code``."""
    code = _AS_PROVIDER.get(code, code)
    return code if code in _PROVIDER_CODES else "ERROR_CAPTCHA_UNSOLVABLE"


class BudgetSpent(errors.GaveUpError):
    """The tenant's ``daily_captchas`` are spent: answered as an empty balance."""

    default_code = "ERROR_ZERO_BALANCE"


@dataclass(frozen=True)
class Answer:
    """What one id stands for now: ``state`` is ``unknown`` (an id this tenant was not
    given), ``pending``, ``solved`` (``outcome`` holds it) or ``failed`` (``code``: the
    provider's code, ``message``: ours)."""

    state: str
    outcome: Mapping[str, Any] | None = None
    code: str = ""
    message: str = ""

    @property
    def token(self) -> Any:
        assert self.outcome is not None
        return self.outcome["token"]

    @property
    def user_agent(self) -> str | None:
        return None if self.outcome is None else self.outcome.get("user_agent")


@dataclass(frozen=True)
class Callback:
    """A client's own callback URL, allowed by its tenant's ``callback_hosts``, and the
    face it came in by (:data:`IN_PHP_FACE` or :data:`JSON_FACE`)."""

    url: str
    face: str


UNKNOWN = Answer("unknown", code="ERROR_WRONG_CAPTCHA_ID")
PENDING = Answer("pending", code="CAPCHA_NOT_READY")


@dataclass(frozen=True)
class Threads:
    """A tenant's view of the threads: those it may use, and those it holds."""

    threads: int
    working: int

    @property
    def free(self) -> int:
        return max(0, self.threads - self.working)


class Gateway:
    """The gateway's operations for one deployment (thread-safe)."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.settings = app.runtime().settings
        self.results = Results(app)

    def submit(
        self,
        tenant: Tenant,
        fields: Mapping[str, Any],
        lane: str | None,
        callback: Callback | None = None,
    ) -> str:
        """Submit a captcha for ``tenant``; its id.  ``fields``: ``solve``'s keyword
        arguments; ``callback``: where to send the answer too.  Raises
        :class:`~captcha_tasks.errors.ValidationError` (bad fields), :class:`BudgetSpent`,
        :class:`~captcha_tasks.errors.StoreUnavailable`."""
        kwargs = {**fields, "tenant": tenant.name, "lane": lane}
        normalized = normalize_solve_args((), kwargs, self.settings)
        method = str(normalized["method"])
        self._check_budget(tenant)
        pooled = self._from_pool(normalized)
        ttl = self.results.ttl_s
        url, face = (callback.url, callback.face) if callback else (None, None)
        if pooled is not None:
            ticket = Ticket(tenant.name, method, outcome=pooled, callback=url, face=face)
            captcha_id = self.state.gateway.issue(ticket, ttl)
            if callback is not None:
                self._delivery(captcha_id).apply_async()
            return captcha_id
        task_id = str(uuid.uuid4())
        ticket = Ticket(tenant.name, method, task_id, callback=url, face=face)
        captcha_id = self.state.gateway.issue(ticket, ttl)
        options: dict[str, Any] = {}
        if callback is not None:
            delivery = self._delivery(captcha_id)
            options.update(link=delivery, link_error=delivery)
        solve.apply_async(kwargs=normalized, task_id=task_id, **options)
        return captcha_id

    @staticmethod
    def _delivery(captcha_id: str) -> Any:
        # Immutable: the delivery reads the answer from the result backend, so no token
        # travels in its message (and Celery hands it neither the outcome nor the error).
        return app.signature(names.GATEWAY_CALLBACK, args=(captcha_id,), immutable=True)

    def _check_budget(self, tenant: Tenant) -> None:
        if tenant.daily_captchas is None:
            return
        spent = self.state.budgets.submitted_today([tenant.name])[tenant.name]
        if spent >= tenant.daily_captchas:
            raise BudgetSpent(
                f"tenant {tenant.name!r} spent its {tenant.daily_captchas} captchas for today"
                " (daily_captchas; budgets reset at 00:00 UTC)"
            )

    def _from_pool(self, normalized: Mapping[str, Any]) -> dict[str, Any] | None:
        params = {k: v for k, v in normalized.items() if k not in ("lane", "tenant")}
        spec = self.state.pools.find(build_request(**params))
        if spec is None:
            return None
        return take_token(spec.name)

    def answers(self, tenant: Tenant, captcha_ids: Sequence[str]) -> list[Answer]:
        """What each of ``captcha_ids`` stands for now, for ``tenant`` (another tenant's ids
        are unknown to it)."""
        tickets = self.state.gateway.look_up(captcha_ids)
        keys = [
            self.results.key(t.task_id)
            for t in tickets
            if t is not None and t.tenant == tenant.name and t.task_id is not None
        ]
        records = iter(self.state.gateway.records(keys))
        found = []
        for ticket in tickets:
            if ticket is None or ticket.tenant != tenant.name:
                found.append(UNKNOWN)
            elif ticket.outcome is not None:
                found.append(Answer("solved", ticket.outcome))
            else:
                found.append(self._read(next(records), ticket.method))
        return found

    def _read(self, record: str | None, method: str) -> Answer:
        if record is None:
            return PENDING
        read = self.results.read(record)
        if not read.ready:
            return PENDING
        outcome = read.outcome_dict(method)
        if outcome["status"] == "solved":
            return Answer("solved", outcome)
        return Answer("failed", code=provider_code(outcome["error"]), message=outcome["message"])

    def report(self, tenant: Tenant, captcha_id: str, good: bool) -> bool:
        """Tell the provider that solved ``captcha_id`` whether its token worked (as
        ``captcha_tasks.report`` does); False for an id with no solved captcha."""
        [answer] = self.answers(tenant, [captcha_id])
        if answer.state != "solved" or answer.outcome is None:
            return False
        if not answer.outcome.get("captcha_id"):
            return False
        report(dict(answer.outcome), good=good)
        return True

    def balance(self, tenant: Tenant) -> float:
        """What ``tenant`` may still spend: the captchas left of its daily budget, or (no
        budget) the providers' balance as last read."""
        if tenant.daily_captchas is not None:
            spent = self.state.budgets.submitted_today([tenant.name])[tenant.name]
            return float(max(0, tenant.daily_captchas - spent))
        known = [c.balance for c in self.state.circuits.read().values() if c.balance is not None]
        return float(sum(known))

    def threads(self, tenant: Tenant) -> Threads:
        """The threads ``tenant`` may use (its ``max_threads``, within the account's) and
        those it holds now, at every provider."""
        account = sum(spec.capacity for spec in self.settings.providers.all)
        limit = min(tenant.max_threads or account, account)
        held = sum(use.held for (_, name), use in self.state.lanes().items() if name == tenant.name)
        return Threads(limit, held)

"""What a request carries outside its task messages: the proxy and cookies its caller
stashed in Redis, and the proxies of the shared pool.

A job never carries a proxy password or a cookie value (:attr:`~captcha_tasks.core.job.Job.secrets`
names them): they are put back into its request only for the ``in.php`` call.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from .. import errors
from ..core.decisions import Resubmit
from ..core.job import Job
from ..core.proxyspec import split
from ..methods import SolveRequest
from ..state import State

log = logging.getLogger(__name__)


class Stash:
    """The stashed parameters and pooled proxies of one runner's solves."""

    def __init__(self, state: State) -> None:
        self.state = state

    def stashed(self, solve_id: str, names: list[str]) -> dict[str, Any]:
        """The proxy and cookies the caller stashed for this solve (see ``SolveTask``)."""
        if not names:
            return {}
        found = self.state.secrets.fetch(solve_id, names)
        if found is None:
            raise errors.SolveTimeout("the solve's proxy/cookies expired before it started")
        return found

    def full_request(self, job: Job) -> SolveRequest:
        """The job's request with its stashed proxy and cookies put back."""
        if not job.secrets:
            return job.request
        found = self.state.secrets.fetch(job.solve_id, list(job.secrets))
        if found is None:
            raise errors.SolveTimeout("the solve's proxy/cookies expired before it was submitted")
        return replace(job.request, params={**job.request.params, **found})

    def with_pool_proxy(self, request: SolveRequest, job: Job) -> SolveRequest:
        """Swap ``proxy="pool"`` for a proxy from the shared pool (sticky per owner)."""
        if not request.uses_proxy_pool:
            return request
        proxy = self.state.proxies.acquire(proxy_owner(job))
        if proxy is None:
            raise errors.NoProxyAvailable("every pooled proxy is taken or cooling off")
        return request.with_proxy(*split(proxy))

    def replace_proxy(self, job: Job, decision: Resubmit) -> None:
        """Quarantine the pooled proxy a resubmit says was bad (its next attempt takes
        another)."""
        if decision.replace_proxy:
            log.warning(
                "solve %s: pooled proxy failed (%s); quarantined",
                job.solve_id,
                decision.error.code,
            )
            self.state.proxies.replace(proxy_owner(job))


def proxy_owner(job: Job) -> str:
    """Who holds the job's pooled proxy: the caller's ``proxy_owner``, else its solve."""
    return str(job.request.params.get("proxy_owner") or f"solve:{job.solve_id}")

"""Provider health, as the worker sees it: each request's outcome goes to the provider's
circuit, an HTTP 429 holds its account, answers go to its callback channel, and whether
its API honours bulk polls is remembered.

Each act asks the core what the outcome means (:mod:`captcha_tasks.core.health`,
:mod:`captcha_tasks.core.channel`) and records it in Redis, where every worker reads it;
the transitions are logged once, by the process that made them.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

from .. import errors
from ..core import health
from ..core.channel import CHANNEL_WEIGHT, DEGRADED, DOWN, UP, Channel, Heard, judge_channel
from ..core.dialects import takes_callbacks
from .edges import Edges

log = logging.getLogger(__name__)

#: Seconds a process trusts what it last read about the API's bulk support.
BULK_CHECK_S = 5.0


class Health:
    """What one runner records of its providers' health."""

    def __init__(self, edges: Edges) -> None:
        self.edges = edges
        self.state = edges.state
        #: Per provider: when this process last read whether its API answers bulk polls.
        self._bulk_checked: dict[str, tuple[float, bool]] = {}

    # -- circuits ----------------------------------------------------------------------
    def answered(self, provider: str | None, error: errors.CaptchaTasksError | None) -> bool:
        """Record how a request to ``provider`` went (``error``: None when it answered);
        True when the provider is out of rotation now."""
        name = self.state.provider(provider).name
        circuits = self.state.circuits
        write = health.on_request(circuits.view()[name], error)
        if isinstance(write, health.ClearFailures):
            circuits.succeeded(name)
        if not isinstance(write, health.CountFailure):
            return False
        counted = circuits.failed(name, write.code, write.why)
        if counted.opened:
            self._opened(name, write)
        return counted.open

    def _opened(self, name: str, write: health.CountFailure) -> None:
        spec = self.state.provider(name).spec
        others = [p.name for p in self.edges.settings.providers.all if p.name != name]
        log.warning(
            "provider %s is out of rotation: %s%s; new captchas go to %s until a probe"
            " finds it back",
            name,
            write.code,
            f" (check {spec.key_env})" if write.why == "key" else "",
            ", ".join(others) or "no other provider",
        )

    def hold_account(self, exc: errors.CaptchaTasksError, provider: str | None) -> None:
        """An HTTP 429 holds every request to the provider (see
        :func:`~captcha_tasks.core.health.account_hold`)."""
        hold = health.account_hold(exc)
        if hold is None:
            return
        at = self.state.provider(provider)
        log.warning("provider %s answered 429: every request waits %.1f s", at.name, hold)
        try:
            at.limiter.pause(hold)
        except errors.StoreUnavailable:  # the steps wait for it anyway
            log.debug("could not record the 429 pause")

    # -- bulk polls --------------------------------------------------------------------
    def bulk(self, provider: str | None = None) -> bool:
        """Whether pipe-safe captchas are polled in bulk at ``provider``: the setting, and
        whether its API honours ``ids=`` (read from Redis at most every
        :data:`BULK_CHECK_S`).  The JSON family has no bulk poll: one task per request."""
        if self.edges.settings.solving.bulk_poll != "auto":
            return False
        at = self.state.provider(provider)
        if at.spec.protocol != "in.php":
            return False
        checked_at, supported = self._bulk_checked.get(at.name, (-math.inf, True))
        now = time.monotonic()
        if now - checked_at >= BULK_CHECK_S:
            supported = at.stats.bulk_supported() is not False
            self._bulk_checked[at.name] = (now, supported)
        return supported

    def probes(self, provider: str | None = None) -> bool:
        """Whether ``provider``'s cold captchas are probed on their own (the JSON family:
        no bulk poll to probe them in, and no account budget on polls)."""
        return self.state.provider(provider).spec.protocol == "json"

    def saw_bulk(self, provider: str, supported: bool) -> None:
        """A bulk request showed whether the provider's API honours ``ids=``."""
        stats = self.state.provider(provider).stats
        self._bulk_checked[provider] = (time.monotonic(), supported)
        if stats.bulk_supported() is not supported:
            stats.set_bulk_supported(supported)
        if not supported:
            log.info(
                "provider %s does not answer res.php?ids=; polling one id per request", provider
            )

    # -- the callback channel ----------------------------------------------------------
    def channel(self, provider: str | None) -> str:
        """The state of ``provider``'s callback channel (``down`` when callbacks are off, or
        Redis does not say: poll as without them, as for a provider that never calls
        back)."""
        if self.edges.policy.pingback_fallback is None:
            return DOWN
        if not takes_callbacks(self.state.provider(provider).spec.kind):
            return DOWN
        try:
            return self.state.provider(provider).channel.read().state
        except errors.StoreUnavailable:
            return DOWN

    def heard(self, items: Sequence[Heard | None], provider: str | None) -> None:
        """Tell ``provider``'s callback channel how answers came, and switch its state when
        they say so (one process switches it, and says so once).  Never breaks a solve."""
        found = [h for h in items if h is not None]
        if not found:
            return
        at = self.state.provider(provider)
        try:
            channel = at.channel.observe(found, CHANNEL_WEIGHT)
            switch = judge_channel(channel)
            if switch is not None and at.channel.switch(channel.state, switch.to, switch.share):
                _announce(at.name, channel, switch.to)
        except errors.StoreUnavailable:
            log.debug("could not tell the callback channel about %d answers", len(found))


def _announce(provider: str, channel: Channel, to: str) -> None:
    """Say, once, that ``provider``'s callback channel switched to ``to``."""
    if to == DOWN:
        log.warning(
            "callbacks from provider %s stopped arriving (the last %d answers came by poll):"
            " its captchas are polled as if callbacks were off; pingback URLs are still sent,"
            " and callbacks that come back switch this back (can the provider reach"
            " CAPTCHAAI_PINGBACK_URL?)",
            provider,
            channel.misses,
        )
    elif to == DEGRADED and channel.state == UP:
        log.warning(
            "only %.0f%% of recent answers from provider %s came by callback: its captchas"
            " are polled from about their method's 25th percentile solve time on",
            100 * channel.share,
            provider,
        )
    elif to == DEGRADED:
        log.info("callbacks from provider %s arrive again: polling less (degraded)", provider)
    elif to == UP:
        log.info("callbacks from provider %s arrive reliably: captchas wait for them", provider)

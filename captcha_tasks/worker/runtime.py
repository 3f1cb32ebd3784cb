"""What one process needs to run captcha-tasks: built in one place, handed to the rest.

A :class:`Runtime` holds the process's settings, its Redis state
(:class:`~captcha_tasks.state.State`), the API client and the :class:`~.adapter.Runner`
built on them.  The package's Celery app (:mod:`.app`) builds one per process when it is
first needed, from the environment; a forked worker child builds its own.  An entry point
or a test that wants other settings hands the app a runtime of its own
(:meth:`~.app.App.use`).  Nothing below this module fetches a shared object from a global.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..core.providers import ProviderSpec
from ..errors import ConfigurationError
from ..providers.inphp import ProviderAPI, Timeout
from ..providers.jsonapi import api_for
from ..settings import Settings
from ..state import State
from .adapter import Runner
from .celery_compat.messages import send_task_event

if TYPE_CHECKING:
    from celery import Celery

T = TypeVar("T")


def api_client(settings: Settings, spec: ProviderSpec | None = None) -> ProviderAPI:
    """The API client of a provider (default: the primary) with the settings' timeouts, in
    the protocol of its kind: one pooled HTTP session, the key from the settings.
    ``CAPTCHAAI_SOFT_ID`` goes to the primary only: a developer id belongs to one
    provider."""
    spec = spec or settings.providers.primary
    if not spec.api_key:
        raise ConfigurationError(
            f"{spec.key_env} is not set: the API calls of workers and of "
            "`captcha-tasks account` need the account key"
        )
    return api_for(
        spec,
        timeout=Timeout(settings.providers.connect_timeout, settings.providers.read_timeout),
        soft_id=settings.providers.soft_id if spec.primary else None,
    )


class Runtime:
    """The settings, Redis state, API client and runner of one process."""

    def __init__(
        self,
        app: Celery,
        settings: Settings,
        state: State | None = None,
        api: ProviderAPI | None = None,
    ) -> None:
        self.app = app
        self.settings = settings
        self.state = state if state is not None else State.build(settings)
        self._apis: dict[str, ProviderAPI] = {}
        if api is not None:
            self._apis[settings.providers.primary.name] = api
        self._lock = threading.Lock()
        self._resources: dict[str, Any] = {}
        #: The worker this process runs (set by the worker's housekeeping step), whose
        #: event dispatcher Flower turns on.
        self.worker: Any = None
        #: That worker's housekeeping step (which a reconnected consumer re-arms).
        self.housekeeping: Any = None
        self.runner = Runner(app, settings, self.state, self.api, self.event)

    def api(self, provider: str | None = None) -> ProviderAPI:
        """The API client of ``provider`` (None: the primary; a provider no longer
        configured: the primary), built on first use: only workers and some commands hold
        the keys; :class:`ConfigurationError` without one."""
        try:
            spec = self.settings.providers.named(provider)
        except KeyError:
            spec = self.settings.providers.primary
        client = self._apis.get(spec.name)
        if client is None:
            with self._lock:
                client = self._apis.get(spec.name)
                if client is None:
                    client = self._apis[spec.name] = api_client(self.settings, spec)
        return client

    def event(self, type_: str, task_id: str, **fields: Any) -> None:
        """Send a task event, when a monitor (Flower) turned this worker's events on; a
        process that is no worker (the receiver, an app) sends none."""
        send_task_event(self.worker, type_, task_id, **fields)

    def resource(self, name: str, build: Callable[[], T]) -> T:
        """An object an upper layer keeps for as long as this runtime lives (the asyncio
        API's connections, say): built once, on first use.  A new runtime (in a forked
        child, or after ``app.use``) starts without any."""
        with self._lock:
            if name not in self._resources:
                self._resources[name] = build()
            return cast(T, self._resources[name])

    def register_configured(self) -> int:
        """Register the pools of ``CAPTCHAAI_POOLS`` and the proxies of
        ``CAPTCHAAI_PROXIES`` in Redis (idempotent); returns the pools registered."""
        self.state.pools.ensure_declared()
        if self.settings.proxies.listed:
            self.state.proxies.add(*self.settings.proxies.listed)
        return len(self.settings.pools.declared)

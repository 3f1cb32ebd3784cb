"""A solve's state as it travels from step to step: the typed :class:`Job`.

A job is a frozen value inside a process and JSON only at the boundary: in a task message
(``submit``) and in Redis (the board, the limiter's parked and owed submits), where the
state layer keeps it as an opaque string.  It carries the request (never the API key,
never a proxy password or cookies: those wait in Redis, named in :attr:`Job.secrets`), its
budgets and the current attempt's captcha.

The JSON shape is stable across releases: a worker of the next version reads the jobs a
worker of this one parked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..methods import METHODS, SolveRequest
from .lanes import BACKGROUND, DEFAULT_TENANT, INTERACTIVE, LANES, is_tenant_name


@dataclass(frozen=True)
class BatchRef:
    """The batch a solve belongs to, and its index in the caller's input."""

    id: str
    index: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> BatchRef | None:
        return None if not data else cls(str(data["id"]), int(data["index"]))

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "index": self.index}


@dataclass(frozen=True)
class Job:
    """One solve's state (see the module docstring)."""

    solve_id: str
    request: SolveRequest
    started: float
    deadline: float
    attempt: int = 0
    transport_errors: int = 0
    resubmits: int = 0
    #: The token pool a refill solves for (its outcome goes there, not to a caller).
    pool: str | None = None
    batch: BatchRef | None = None
    #: The current attempt's captcha at the provider, and when it was submitted.
    captcha_id: str | None = None
    submitted_at: float | None = None
    #: Request parameters stashed in Redis (proxy, cookies), not in ``request.params``.
    secrets: tuple[str, ...] = ()
    #: When the caller's ``expires`` passes (Unix time): not submitted after that.
    expires: float | None = None
    #: The provider the job was last admitted at (its slot, its parked or deferred entry,
    #: its captcha are there); None before its first admission.
    provider: str | None = None
    #: When the current captcha's callback is overdue (Unix time), if it waits for one.
    callback_due: float | None = None
    #: The lane and tenant it was asked for in (None: the defaults, see :attr:`lane_name`).
    lane: str | None = None
    tenant: str | None = None
    #: When its caller asked for it (Unix time, the caller's clock), if known.
    asked: float | None = None
    #: The tasks the caller linked to the solve (their ids, fixed when it was asked), as its
    #: result record lists them: opaque here, JSON-compatible.
    children: tuple[Any, ...] = ()

    @classmethod
    def new(
        cls,
        solve_id: str,
        request: SolveRequest,
        now: float,
        timeout_s: float,
        *,
        pool: str | None = None,
        batch: BatchRef | None = None,
        expires: float | None = None,
        lane: str | None = None,
        tenant: str | None = None,
        asked: float | None = None,
        children: tuple[Any, ...] = (),
    ) -> Job:
        return cls(
            solve_id,
            request,
            now,
            now + timeout_s,
            pool=pool,
            batch=batch,
            expires=expires,
            lane=lane,
            tenant=tenant,
            asked=asked,
            children=children,
        )

    @classmethod
    def unusable(
        cls,
        solve_id: str,
        method: Any,
        now: float,
        batch: BatchRef | None,
        lane: Any = None,
        tenant: Any = None,
    ) -> Job:
        """The job of a solve message whose request is not valid (it can only fail); its
        lane and tenant as the message named them, when they are names at all."""
        name = method if isinstance(method, str) and method in METHODS else "unknown"
        return cls(
            solve_id,
            SolveRequest(name, None, None, {}),
            now,
            now,
            batch=batch,
            lane=lane if lane in LANES else None,
            tenant=tenant if is_tenant_name(tenant) else None,
        )

    @property
    def lane_name(self) -> str:
        """The lane it is served in (a job from before lanes: a refill's is background,
        any other's interactive)."""
        return self.lane or (BACKGROUND if self.pool else INTERACTIVE)

    @property
    def tenant_name(self) -> str:
        return self.tenant or DEFAULT_TENANT

    @property
    def for_caller(self) -> bool:
        """Whether a caller waits on the solve's own result (not a batch, not a refill)."""
        return self.pool is None and self.batch is None

    # -- steps ---------------------------------------------------------------------------
    def submitted(self, captcha_id: str, now: float) -> Job:
        """This attempt is at the provider as ``captcha_id``."""
        return replace(
            self, captcha_id=captcha_id, submitted_at=now, transport_errors=0, callback_due=None
        )

    def next_attempt(self) -> Job:
        """A new captcha for the same solve (a resubmit)."""
        return replace(
            self,
            attempt=self.attempt + 1,
            resubmits=self.resubmits + 1,
            captcha_id=None,
            submitted_at=None,
            transport_errors=0,
            callback_due=None,
        )

    def moved(self) -> Job:
        """A new captcha for the same solve because its provider went out of rotation: a
        new attempt, not counted against the resubmit budget."""
        return replace(
            self, attempt=self.attempt + 1, captcha_id=None, submitted_at=None, callback_due=None
        )

    def at(self, provider: str) -> Job:
        """The job as admitted at ``provider``."""
        return self if provider == self.provider else replace(self, provider=provider)

    def with_secrets(self, names: list[str]) -> Job:
        """The job as it travels on: the stashed parameters are named, never carried."""
        if not names:
            return self
        params = {k: v for k, v in self.request.params.items() if k not in names}
        request = replace(self.request, params=params)
        return replace(self, request=request, secrets=tuple(sorted(names)))

    def label(self) -> str:
        """A readable, secret-free label for Flower and the worker log."""
        parts = [self.request.method, self.request.sitekey or "", f"solve={self.solve_id}"]
        if self.captcha_id:
            parts.append(f"captcha={self.captcha_id}")
        if self.attempt:
            parts.append(f"attempt={self.attempt}")
        if self.provider:
            parts.append(f"provider={self.provider}")
        return "(" + " ".join(p for p in parts if p) + ")"

    # -- the JSON boundary ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        request: dict[str, Any] = self.request.to_dict()
        if self.secrets:
            request["secrets"] = list(self.secrets)
        data: dict[str, Any] = {
            "solve_id": self.solve_id,
            "request": request,
            "started": self.started,
            "deadline": self.deadline,
            "attempt": self.attempt,
            "transport_errors": self.transport_errors,
            "resubmits": self.resubmits,
            "pool": self.pool,
            "batch": self.batch.to_dict() if self.batch else None,
        }
        if self.captcha_id is not None:
            data["captcha_id"] = self.captcha_id
            data["submitted_at"] = self.submitted_at
        for name in ("expires", "lane", "tenant", "asked", "provider", "callback_due"):
            value = getattr(self, name)
            if value is not None:
                data[name] = value
        if self.children:
            data["children"] = list(self.children)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Job:
        request = data["request"]
        captcha_id = data.get("captcha_id")
        return cls(
            solve_id=str(data["solve_id"]),
            request=SolveRequest.from_dict(request),
            started=float(data["started"]),
            deadline=float(data["deadline"]),
            attempt=int(data.get("attempt", 0)),
            transport_errors=int(data.get("transport_errors", 0)),
            resubmits=int(data.get("resubmits", 0)),
            pool=data.get("pool"),
            batch=BatchRef.from_dict(data.get("batch")),
            captcha_id=None if captcha_id is None else str(captcha_id),
            submitted_at=data.get("submitted_at"),
            secrets=tuple(request.get("secrets") or ()),
            expires=data.get("expires"),
            provider=data.get("provider"),
            callback_due=data.get("callback_due"),
            lane=data.get("lane"),
            tenant=data.get("tenant"),
            asked=data.get("asked"),
            children=tuple(data.get("children") or ()),
        )

    @classmethod
    def from_json(cls, text: str) -> Job:
        return cls.from_dict(json.loads(text))

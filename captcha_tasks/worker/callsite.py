"""What ``solve`` checks and keeps aside at the call site, before anything is queued:
its arguments (as :func:`normalize_solve_args` returns them, for ``solve.delay``, the
gateway, the Kafka bridge and batch files alike) and the caller's secrets (a proxy's
password, cookies), which wait in Redis instead of travelling in the message."""

from __future__ import annotations

from typing import Any

from .. import errors
from ..core.lanes import check_lane, check_tenant
from ..methods import POOL_PROXY, build_request
from ..settings import Settings
from ..state import State
from .app import app
from .redact import SECRET_PARAMS

#: Seconds a solve's stashed proxy and cookies may wait for it (it may queue behind a batch).
SECRETS_TTL_S = 24 * 3600


def stash_secrets(state: State, solve_id: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Keep the caller's proxy and cookies out of every task message: they wait in Redis
    (under a key with a TTL, deleted when the solve ends) for the worker that needs them."""
    secret = {k: v for k, v in kwargs.items() if k in SECRET_PARAMS and v != POOL_PROXY}
    if not secret:
        return kwargs
    state.secrets.stash(solve_id, secret, SECRETS_TTL_S)
    kept = {k: v for k, v in kwargs.items() if k not in secret}
    return {**kept, "_secrets": sorted(secret)}


def normalize_solve_args(
    args: Any, kwargs: dict[str, Any], settings: Settings | None = None
) -> dict[str, Any]:
    """Validate ``solve``'s arguments; returns them as keyword arguments (with ``lane`` and
    ``tenant`` when the caller named them: a lane of :data:`~captcha_tasks.core.lanes.LANES`, a
    tenant ``settings`` declare; default: this process's settings)."""
    kwargs = dict(kwargs)
    route: dict[str, str] = {}
    if kwargs.get("lane") is not None:
        route["lane"] = check_lane(kwargs["lane"])
    if kwargs.get("tenant") is not None:
        tenants = (settings or app.settings()).tenants.declared
        route["tenant"] = check_tenant(kwargs["tenant"], tenants)
    kwargs.pop("lane", None)
    kwargs.pop("tenant", None)
    names = ("method", "sitekey", "pageurl")
    if len(args) > len(names):
        raise errors.ValidationError("solve takes at most method, sitekey, pageurl positionally")
    merged = dict(zip(names, args, strict=False))
    for name in merged:
        if name in kwargs:
            raise errors.ValidationError(f"solve got {name} twice")
    merged.update(kwargs)
    request = build_request(**merged)
    return {
        "method": request.method,
        "sitekey": request.sitekey,
        "pageurl": request.pageurl,
        **request.params,
        **route,
    }

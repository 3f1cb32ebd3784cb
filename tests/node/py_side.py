"""The Python side of the Node.js client's tests (``clients/node/test``): one command per
call, the Python package's own classes doing the work, JSON on stdout.

The Node tests run it as ``$CT_PYTHON tests/node/py_side.py <command> [args]`` with the
test's ``REDIS_URL`` and ``CAPTCHAAI_KEY_PREFIX``: what Python writes Node must read, and
the other way round.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import redis

from captcha_tasks import errors
from captcha_tasks.core.outcome import from_pool, iso
from captcha_tasks.core.poolspec import PoolSpec
from captcha_tasks.state import connections, pools
from captcha_tasks.state.db import Db
from captcha_tasks.state.keys import Keys
from captcha_tasks.state.lua import LIBRARY
from captcha_tasks.state.pools import PoolStore
from captcha_tasks.toolkit.proxies import ProxyPool
from captcha_tasks.toolkit.sessions import CookieStore, SessionLock

#: Arguments the key builders are called with when their names are compared.
SAMPLE = {"name": "login", "domain": "shop.example", "owner": "w-1", "proxy_id": "0123abcd"}
#: The builders the Node client has, by their Python names.
BUILDERS = (
    "pool_registry",
    "pool_tokens",
    "pool_stats",
    "pool_takes",
    "cookies",
    "session_lock",
    "session_version",
    "proxies",
    "proxy_assignment",
    "proxy_owner",
    "proxy_quarantine",
)


def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ["REDIS_URL"], decode_responses=True)


def _keys() -> Keys:
    return Keys(os.environ.get("CAPTCHAAI_KEY_PREFIX", "captcha"))


def _pools() -> PoolStore:
    return PoolStore(Db(_redis(), _keys()))


def key_names(prefix: str) -> dict[str, str]:
    """Every builder's key for the sample arguments it takes."""
    keys = Keys(prefix)
    out = {}
    for name in BUILDERS:
        build = getattr(keys, name)
        params = build.__code__.co_varnames[1 : build.__code__.co_argcount]
        out[name] = build(*(SAMPLE[p] for p in params))
    return out


def shas() -> dict[str, str]:
    return {name: LIBRARY.script(name).sha for name in LIBRARY.names()}


def error_tree() -> list[list[str]]:
    rows = []
    for cls in errors._tree(errors.CaptchaTasksError)[1:]:
        parent = cls.__bases__[0]
        rows.append([cls.__name__, parent.__name__, cls.default_code])
    return rows


def constants() -> dict[str, Any]:
    """The numbers the Node client copies (its lib/fence.js and lib/client.js)."""
    return {
        "FOLLOW_S": connections.FOLLOW_S,
        "MOVE_SETTLE_S": connections.MOVE_SETTLE_S,
        "FENCE_WAIT_MS": connections.FENCE_WAIT_MS,
        "SENTINEL_TIMEOUT_S": connections.SENTINEL_TIMEOUT_S,
        "NOT_A_CANDIDATE": sorted(connections._NOT_A_CANDIDATE),
        "WAIT": list(connections.ReplicaFence.wait_command()),
        "TAKE_HISTORY_S": pools.TAKE_HISTORY_S,
    }


def declare(name: str) -> bool:
    spec = {
        "name": name,
        "method": "turnstile",
        "sitekey": "0x4AAA-node",
        "pageurl": "https://shop.example/",
    }
    return _pools().register(
        PoolSpec.from_dict({**spec, "size": 50, "ttl": 280, "min_remaining": 5})
    )


def fill(name: str, count: str, tag: str) -> int:
    """Pool ``count`` solved tokens the way a refill does (``PoolStore.add``)."""
    store, now = _pools(), time.time()
    added = 0
    for n in range(int(count)):
        record = {
            "status": "solved",
            "captcha_id": f"{tag}-{n}",
            "method": "turnstile",
            "source": "api",
            "elapsed_s": 1.0,
            "solved_at": iso(now),
            "expires_at": iso(now + 250),
            "provider": "sandbox",
            "token": f"tok-{tag}-{n}",
        }
        added += store.add(name, record, 250)
    return added


def take(name: str) -> dict[str, Any] | None:
    """One take in ``take_token``'s shape (without its Celery refill message)."""
    started = time.monotonic()
    record = _pools().take(name)
    if record is None:
        return None
    outcome = from_pool(record, time.monotonic() - started, time.time()).to_dict()
    token = outcome.pop("token")
    return {**outcome, "remaining_s": record["remaining_s"], "token": token}


def race(name: str, ready_key: str, go_key: str) -> list[str]:
    """Say ready, wait for the start, take one token and say so, wait until every racer has
    one, then take until the pool is dry: the tokens taken."""
    r, store = _redis(), _pools()
    r.incr(ready_key)
    r.blpop([go_key], timeout=60)
    taken = []
    if (record := store.take(name)) is not None:
        taken.append(record["token"])
    r.incr(f"{ready_key}:first")
    r.blpop([f"{go_key}:race"], timeout=60)
    while (record := store.take(name)) is not None:
        taken.append(record["token"])
    return taken


def cookies_save(domain: str, cookies: str, ttl: str) -> int:
    return CookieStore(_redis(), _keys()).save(domain, json.loads(cookies), float(ttl))


def cookies_load(domain: str) -> dict[str, Any]:
    found = CookieStore(_redis(), _keys()).load(domain)
    return {"cookies": dict(found), "version": found.version}


def lock_try(domain: str) -> bool:
    """Whether ``SessionLock.acquire()`` succeeds now (released again if it did)."""
    lock = SessionLock(_redis(), _keys(), domain)
    taken = lock.acquire()
    if taken:
        lock.release()
    return taken


def lock_hold(domain: str) -> bool:
    """Hold the lock until a line comes on stdin; prints ``held`` once it is taken."""
    lock = SessionLock(_redis(), _keys(), domain, ttl_ms=60_000)
    if not lock.acquire():
        return False
    print(json.dumps("held"), flush=True)
    sys.stdin.readline()
    return lock.release()


def _proxy_pool() -> ProxyPool:
    return ProxyPool(_redis(), _keys())


def proxies_add(*proxies: str) -> int:
    return _proxy_pool().add(*proxies)


def proxy_lease(owner: str) -> str | None:
    return _proxy_pool().acquire(owner)


def proxy_current(owner: str) -> str | None:
    return _proxy_pool().current(owner)


def proxy_release(owner: str) -> bool:
    return _proxy_pool().release(owner)


def proxy_quarantine(proxy: str) -> None:
    _proxy_pool().quarantine(proxy, 60)


COMMANDS: dict[str, Callable[..., Any]] = {
    "keys": key_names,
    "shas": shas,
    "errors": error_tree,
    "constants": constants,
    "declare": declare,
    "fill": fill,
    "take": take,
    "race": race,
    "cookies-save": cookies_save,
    "cookies-load": cookies_load,
    "lock-try": lock_try,
    "lock-hold": lock_hold,
    "proxies-add": proxies_add,
    "proxy-lease": proxy_lease,
    "proxy-current": proxy_current,
    "proxy-release": proxy_release,
    "proxy-quarantine": proxy_quarantine,
}


def main(argv: list[str]) -> None:
    command, *args = argv
    print(json.dumps(COMMANDS[command](*args)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

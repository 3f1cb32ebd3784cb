"""The public API, listed in one place: every import path users may rely on, with what it
is for.  A removal or rename of any of them is a breaking change.

* The top-level names are the package's ``__all__`` (``from captcha_tasks import solve``),
  kept there as a literal list so that type checkers see them.
* :data:`DOCUMENTED`: the deeper paths the documentation tells users to use.
* :data:`REMOVED`: the paths of 0.1.0 gone since 0.2.0 (most deprecated in 0.1.0), with
  what to use instead.

Anything else is internal and may change between versions.  The documentation's Python
API page is written from this module (``docs/gen_reference.py``), and
``tests/core/test_public_api.py`` pins it against a literal copy.
"""

from __future__ import annotations

#: Import paths below the top level that the documentation uses, with what each is for.
DOCUMENTED: dict[str, str] = {
    "captcha_tasks.batch.stream": "a batch, in completion order (also `captcha_tasks.stream`)",
    "captcha_tasks.aio.solve": "await a solve from an asyncio event loop",
    "captcha_tasks.aio.stream": "async for over a batch, in completion order",
    "captcha_tasks.aio.aclose": "close this event loop's Redis connections early",
    "captcha_tasks.aio.report": "report a token the site accepted or rejected, from asyncio",
    "captcha_tasks.errors.FatalError": "every error class, split by what to do next",
    "captcha_tasks.toolkit.sessions.CookieStore": "cookies shared by every worker",
    "captcha_tasks.toolkit.sessions.SessionLock": "one login at a time across workers",
    "captcha_tasks.toolkit.sessions.reauthenticate": "exactly one worker logs in again",
    "captcha_tasks.toolkit.sessions.try_reauthenticate": "the same, without blocking a task",
    "captcha_tasks.toolkit.proxies.ProxyPool": "sticky proxies with quarantine",
    "captcha_tasks.state.State": "the Redis state of a deployment, built from its settings",
    "captcha_tasks.kafka.client.TaskProducer": "put many tasks on the Kafka tasks topic",
    "captcha_tasks.kafka.client.enqueue": "put one task on the Kafka tasks topic",
    "captcha_tasks.receiver.default_receiver": "mount the pingback receiver in your app",
    "captcha_tasks.receiver.MAX_BODY": "the largest callback body the receiver reads",
    "captcha_tasks.schemas.load": "the JSON Schemas of the contract",
    "captcha_tasks.testing.sandbox.SandboxServer": "a provider API in your own tests",
    "captcha_tasks.testing.sandbox.SandboxConfig": "its threads, solve times and faults",
    "captcha_tasks.testing.processes.SandboxProcess": "a sandbox provider to kill and restart",
    "captcha_tasks.testing.processes.RedisServer": "a throwaway Redis server for a test",
}

#: Import paths of 0.1.0 that 0.2.0 removed, with what to use instead (the value): the
#: deprecated re-exports, ``captcha_tasks.dev`` (its sandbox is ``captcha_tasks.testing``),
#: the modules folded into packages, and the module ``captcha_tasks.stream`` (now
#: ``captcha_tasks.batch``: ``captcha_tasks.stream`` is the function alone).
REMOVED: dict[str, str] = {
    "captcha_tasks.sessions": "captcha_tasks.toolkit.sessions",
    "captcha_tasks.state.sessions": "captcha_tasks.toolkit.sessions",
    "captcha_tasks.state.proxies.ProxyPool": "captcha_tasks.toolkit.proxies.ProxyPool",
    "captcha_tasks.store": "captcha_tasks.state.State",
    "captcha_tasks.store.redis_client": "captcha_tasks.state.State.build(app.settings()).redis",
    "captcha_tasks.store.keys": "captcha_tasks.state.keys.Keys(app.settings().redis.key_prefix)",
    "captcha_tasks.store.proxies": "captcha_tasks.toolkit.proxies.ProxyPool.from_settings()",
    "captcha_tasks.dev.devstack.SandboxProcess": "captcha_tasks.testing.processes.SandboxProcess",
    "captcha_tasks.dev.sandbox": "captcha_tasks.testing.sandbox",
    "captcha_tasks.client": "captcha_tasks.providers.inphp",
    "captcha_tasks.jsonclient": "captcha_tasks.providers.jsonapi",
    "captcha_tasks.connections": "captcha_tasks.state.connections",
    "captcha_tasks.keys": "captcha_tasks.state.keys",
    "captcha_tasks.redact": "captcha_tasks.worker.redact",
    "captcha_tasks.stream.stream": "captcha_tasks.batch.stream",
}


def paths() -> list[str]:
    """Every public import path: the top-level names, then :data:`DOCUMENTED`."""
    from . import __all__ as top_level

    return [f"captcha_tasks.{name}" for name in top_level] + list(DOCUMENTED)

"""Lua scripts by name: one atomic operation each, its keys and arguments named.

A :class:`Script` is written against two tables instead of positions:

* ``K``: its keys by name (``K.slots``), passed in ``KEYS`` in the order the script
  declares them (generated, never written by hand);
* ``A``: its arguments, one JSON object in ``ARGV[1]`` (``A.lease_ms``).  Strings that are
  JSON themselves (a job) travel as strings and are stored as they are.

Every script starts with its header (what it does, each ``K`` and ``A`` field, what it
``returns``), then ``now`` (:data:`NOW_MS`: the Redis server's clock in ms, never a host's),
then the :class:`Lib` fragments it uses.  A fragment belongs to the module that owns the
keys it touches (the limiter's slot release, the waiting-entry codec): a script that ends a
solve calls the limiter's functions with the limiter's keys, and never names them itself.

A script is registered once per client (:meth:`Script.bind`, redis-py's ``Script``: EVALSHA,
reloaded after a server restart or a failover).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.commands.core import Script as RedisScript

#: Lua prologue: ``now`` in ms on the Redis server's clock.
NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""


@dataclass(frozen=True)
class Lib:
    """Lua functions one module owns, and the keys (``K.<name>``) they use.  A script's
    header names the fragments it uses (``-- K: SLOTS, RECORD``) for their keys."""

    name: str
    source: str
    keys: tuple[str, ...] = ()
    #: Other fragments these functions call (included once, before this one).
    needs: tuple[Lib, ...] = field(default_factory=tuple)


def _ordered(libs: Sequence[Lib]) -> list[Lib]:
    out: list[Lib] = []
    for lib in libs:
        for dependency in _ordered(lib.needs):
            if dependency not in out:
                out.append(dependency)
        if lib not in out:
            out.append(lib)
    return out


class Script:
    """One atomic operation: ``K`` (keys by name), ``A`` (one JSON argument), ``now``."""

    def __init__(
        self,
        header: str,
        *,
        keys: Sequence[str] = (),
        libs: Sequence[Lib] = (),
        more: str | None = None,
        body: str,
    ) -> None:
        """``more`` names a list of keys of any length after the named ones (``K.<more>``,
        a Lua array), for a script that touches one key per item."""
        libs = _ordered(libs)
        self.libs: tuple[Lib, ...] = tuple(libs)
        names = list(dict.fromkeys([*keys, *(k for lib in libs for k in lib.keys)]))
        self.keys: tuple[str, ...] = tuple(names)
        self.more = more
        table = ", ".join(f"{name} = KEYS[{i}]" for i, name in enumerate(names, start=1))
        rest = (
            f"K.{more} = {{}}\nfor i = {len(names) + 1}, #KEYS do "
            f"table.insert(K.{more}, KEYS[i]) end\n"
            if more
            else ""
        )
        self.header = header.strip("\n")
        self.source = (
            self.header
            + f"\nlocal K = {{{table}}}\n{rest}local A = cjson.decode(ARGV[1])\n"
            + NOW_MS
            + "".join(lib.source for lib in libs)
            + body
        )

    def bind(self, r: redis.Redis) -> Bound:
        """This script registered on client ``r`` (once: keep the result)."""
        return Bound(self, r.register_script(self.source))


class Bound:
    """A :class:`Script` registered on one client, called by name."""

    def __init__(self, script: Script, registered: RedisScript) -> None:
        self.script = script
        self._registered = registered

    @property
    def sha(self) -> str:
        """The script's SHA1 (what ``EVALSHA`` names it by)."""
        return str(self._registered.sha)

    def __call__(
        self,
        keys: Mapping[str, str],
        args: Mapping[str, Any] | None = None,
        client: Any = None,
        more: Sequence[str] = (),
    ) -> Any:
        """Run the script (queued on ``client`` when it is a pipeline); ``more`` are the
        keys of the script's ``more`` list."""
        missing = [name for name in self.script.keys if name not in keys]
        if missing:
            raise KeyError(f"script keys missing: {', '.join(missing)}")
        return self._registered(
            keys=[*(keys[name] for name in self.script.keys), *more],
            args=[json.dumps(args or {}, separators=(",", ":"))],
            client=client,
        )


def text(value: Any) -> str:
    """A reply value as ``str`` (clients without ``decode_responses`` return bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def ms(seconds: float) -> int:
    return int(seconds * 1000)

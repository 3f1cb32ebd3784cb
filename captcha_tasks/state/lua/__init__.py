"""Lua scripts in ``.lua`` files: one atomic operation each, keys and arguments by name.

The files are what Redis runs, read by this module and meant for any other client of the
same Redis (a Node.js package, say) to load alike, so the format is plain text that a few
lines of any language can assemble (``tests/state/lua_assemble.js`` does, in JavaScript).
Under this folder:

* ``<module>/<operation>.lua`` is the script named ``"<module>/<operation>"``
  (``limiter/admit_gate``, ``pools/take``);
* ``lib/<name>.lua`` is a *fragment*: Lua functions one module owns, which scripts
  include.

**A script file** is, in this order:

1. its header, comment lines: what it does, its ``ARGV`` (``A.<field>``), what it
   ``returns``;
2. its keys, a table literal from a line ``local K = {`` to a line ``}``: one entry per
   line, ``name = KEYS[i],`` in ``KEYS`` order from 1, or, last, a list of keys
   ``name = {KEYS[i], ..., KEYS[j]},`` (a caller passes at most that many); comment lines
   between entries say why the script needs each group.  This table is the one
   declaration of the key order: :class:`Script` reads it from the file;
3. ``local A = cjson.decode(ARGV[1])`` when it takes arguments: one JSON object;
4. one line ``--@include lib/<name>.lua`` per fragment it calls;
5. its body.

**A fragment** ``lib/<name>.lua`` has its header, a ``--@include`` line per fragment it
calls, and defines one local, ``<name>``: a table of functions (``function
slots.drop(id)``; ``lib/now.lua`` defines ``now``, the Redis server's clock in ms).
Fragment functions read the including script's ``K`` and ``now``, never ``A`` or
``KEYS``.

**Assembly** (:func:`source`): read the script file; replace each ``--@include <path>``
line with the assembled text of the file at ``<path>`` (relative to this folder, its own
includes resolved the same way) or, when that file was included before, with nothing.
Each fragment is in once, in the order it was first named; nothing else is substituted
(no templating: a constant both languages need is a literal in the file, and a test
checks it against the Python one).  The SHA1 of the result's UTF-8 bytes is what
``EVALSHA`` names the script by; ``python -m captcha_tasks.state.lua`` prints every
script's.

A script is registered once per client (:meth:`Script.bind`: redis-py's ``Script``,
``EVALSHA``, loaded again after a server restart or a failover).  A :class:`Chain` sends
several script calls in one round trip.
"""

from __future__ import annotations

import hashlib
import json
import re
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import redis
from redis.commands.core import Script as RedisScript
from redis.exceptions import NoScriptError

#: The folder of the package's scripts.
ROOT = Path(__file__).resolve().parent
#: Where fragments live, under a library's root.
FRAGMENTS = "lib"

_INCLUDE = re.compile(r"--@include (\S+)")
_FRAGMENT_PATH = re.compile(r"lib/[a-z][a-z0-9_]*\.lua")
_KEY = re.compile(r"(?P<name>[a-z][a-z0-9_]*) = KEYS\[(?P<index>\d+)\],?(?:\s+--.*)?")
_KEY_LIST = re.compile(r"(?P<name>[a-z][a-z0-9_]*) = \{(?P<items>[^}]*)\},?(?:\s+--.*)?")
_LIST_ITEM = re.compile(r"KEYS\[(\d+)\]")


class ScriptFormatError(ValueError):
    """A ``.lua`` file breaks the format of this module's docstring (a packaging bug)."""


class ScriptsLost(redis.ConnectionError):
    """Redis dropped its scripts (a restart, a failover) partway through a :class:`Chain`:
    some of its calls ran and some did not.  An outage to its caller: each script of a
    chain is harmless to run again."""


@dataclass(frozen=True)
class Key:
    """One entry of a script's ``K`` table: a key, or (``size`` set) a list of keys."""

    name: str
    #: Its position in ``KEYS`` (the first of a list), from 1.
    index: int
    size: int | None = None


class Library:
    """The scripts under one folder (the package's: :data:`LIBRARY`), each read and
    assembled once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._sources: dict[str, str] = {}

    def names(self) -> list[str]:
        """Every script's name, sorted (fragments are not scripts)."""
        return sorted(
            path.relative_to(self.root).with_suffix("").as_posix()
            for path in self.root.glob("*/*.lua")
            if path.parent.name != FRAGMENTS
        )

    def fragments(self) -> list[str]:
        """Every fragment's path (``lib/<name>.lua``), sorted."""
        return sorted(f"{FRAGMENTS}/{path.name}" for path in (self.root / FRAGMENTS).glob("*.lua"))

    def text(self, path: str) -> str:
        """A file as it is (``path`` relative to the root)."""
        found = self.root / path
        if not found.is_file():
            raise ScriptFormatError(f"{path}: no such file under {self.root}")
        text = found.read_text(encoding="utf-8")
        if not text.endswith("\n") or "\r" in text:
            raise ScriptFormatError(f"{path}: lines must end with LF, the last one too")
        return text

    def source(self, name: str) -> str:
        """The assembled source of script ``name`` (see the module docstring)."""
        found = self._sources.get(name)
        if found is None:
            found = self._sources[name] = self._assemble(f"{name}.lua", {f"{name}.lua"})
        return found

    def _assemble(self, path: str, seen: set[str]) -> str:
        out: list[str] = []
        for number, line in enumerate(self.text(path).splitlines(keepends=True), start=1):
            match = _INCLUDE.fullmatch(line.rstrip("\n"))
            if match is None:
                out.append(line)
                continue
            included = match.group(1)
            if not _FRAGMENT_PATH.fullmatch(included):
                raise ScriptFormatError(f"{path}:{number}: cannot include {included!r}")
            if included not in seen:
                seen.add(included)
                out.append(self._assemble(included, seen))
        return "".join(out)

    def script(self, name: str) -> Script:
        return Script(name, self)


def _parse_keys(path: str, text: str) -> tuple[Key, ...]:
    """The ``K`` table of a script file."""
    lines = text.splitlines()
    try:
        start = lines.index("local K = {")
    except ValueError:
        return ()
    keys: list[Key] = []
    expected = 1
    for number, raw in enumerate(lines[start + 1 :], start=start + 2):
        line = raw.strip()
        if raw == "}":
            return tuple(keys)
        if not line or line.startswith("--"):
            continue
        if keys and keys[-1].size is not None:
            raise ScriptFormatError(f"{path}:{number}: a list of keys must come last")
        key = _key(path, number, line, expected)
        keys.append(key)
        expected += key.size or 1
    raise ScriptFormatError(f"{path}: the K table has no closing line '}}'")


def _key(path: str, number: int, line: str, expected: int) -> Key:
    single = _KEY.fullmatch(line)
    if single is not None:
        index = int(single["index"])
        if index != expected:
            raise ScriptFormatError(f"{path}:{number}: KEYS[{index}], expected KEYS[{expected}]")
        return Key(single["name"], index)
    listed = _KEY_LIST.fullmatch(line)
    if listed is None:
        raise ScriptFormatError(f"{path}:{number}: not a key entry: {line!r}")
    items = [part.strip() for part in listed["items"].split(",")]
    indices = [int(m[1]) for m in (_LIST_ITEM.fullmatch(item) for item in items) if m]
    if len(indices) != len(items) or indices != list(range(expected, expected + len(items))):
        raise ScriptFormatError(
            f"{path}:{number}: a list of keys is KEYS[{expected}], KEYS[{expected + 1}], ..."
        )
    return Key(listed["name"], expected, len(indices))


class Script:
    """One atomic operation, read from its file on first use."""

    def __init__(self, name: str, library: Library | None = None) -> None:
        self.name = name
        self.library = library or LIBRARY

    def __repr__(self) -> str:
        return f"Script({self.name!r})"

    @cached_property
    def source(self) -> str:
        """What Redis runs: the file with its fragments included."""
        return self.library.source(self.name)

    @cached_property
    def text(self) -> str:
        """The script's own file, fragments not included."""
        return self.library.text(f"{self.name}.lua")

    @cached_property
    def keys(self) -> tuple[Key, ...]:
        """Its ``K`` table, in ``KEYS`` order."""
        return _parse_keys(f"{self.name}.lua", self.text)

    @cached_property
    def header(self) -> str:
        """The comment lines the file opens with."""
        lines = []
        for line in self.text.splitlines():
            if not line.startswith("--") or _INCLUDE.fullmatch(line):
                break
            lines.append(line)
        return "\n".join(lines)

    @property
    def key_count(self) -> int:
        """The most keys a call passes."""
        return sum(key.size or 1 for key in self.keys)

    @property
    def sha(self) -> str:
        """The SHA1 ``EVALSHA`` names it by."""
        return hashlib.sha1(self.source.encode("utf-8")).hexdigest()

    def bind(self, r: redis.Redis) -> Bound:
        """This script registered on client ``r`` (once: keep the result)."""
        return Bound(self, r.register_script(self.source))


KeyValue = str | Sequence[str]


@dataclass(frozen=True)
class Call:
    """One prepared call of a script: its keys and its JSON argument, in order."""

    bound: Bound
    keys: tuple[str, ...]
    argv: tuple[str, ...]


class Bound:
    """A :class:`Script` registered on one client, called with keys by name."""

    def __init__(self, script: Script, registered: RedisScript) -> None:
        self.script = script
        self._registered = registered
        self._names = tuple(key.name for key in script.keys)
        self._lists = any(key.size is not None for key in script.keys)

    @property
    def sha(self) -> str:
        """The script's SHA1 (what ``EVALSHA`` names it by)."""
        return str(self._registered.sha)

    def call(self, keys: Mapping[str, KeyValue], args: Mapping[str, Any] | None = None) -> Call:
        """The call with ``keys`` (by name; names the script does not take are ignored; a
        list of keys is a sequence) and ``args`` (one JSON object)."""
        try:
            values = [keys[name] for name in self._names]
        except KeyError:
            missing = [name for name in self._names if name not in keys]
            raise KeyError(f"{self.script.name}: keys missing: {', '.join(missing)}") from None
        if self._lists or not all(type(value) is str for value in values):
            values = [
                v
                for key in self.script.keys
                for v in _values(self.script.name, key, keys[key.name])
            ]
        argv = json.dumps(args or {}, separators=(",", ":"))
        return Call(self, tuple(values), (argv,))  # type: ignore[arg-type]

    def __call__(
        self,
        keys: Mapping[str, KeyValue],
        args: Mapping[str, Any] | None = None,
        client: Any = None,
    ) -> Any:
        """Run the script (queued on ``client`` when it is a pipeline)."""
        call = self.call(keys, args)
        return self._registered(keys=list(call.keys), args=list(call.argv), client=client)


def _values(script: str, key: Key, value: KeyValue) -> list[str]:
    if key.size is None:
        if not isinstance(value, str):
            raise TypeError(f"{script}: key {key.name} is one key name, not {value!r}")
        return [value]
    if isinstance(value, str) or len(value) > key.size:
        raise TypeError(f"{script}: key {key.name} is a list of at most {key.size} key names")
    return list(value)


#: The scripts each client holds, as far as this process knows (Redis forgets them on a
#: restart or a failover: a chain finds out by NOSCRIPT).
_LOADED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


class Chain:
    """Script calls sent to Redis in one round trip and run in order.

    Each call is atomic, the chain is not: another client's commands may run between two
    of its calls, and a process may die between sending and reading them.  So every
    script meant for a chain is harmless when the calls before it did not run, and harmless
    to run again; a later call that depends on an earlier one's decision reads what the
    earlier one left in Redis (a mark in the solve's record), never its reply.

    The calls go as ``EVALSHA``: the chain makes sure first that Redis holds its scripts
    (once per client, and again after a NOSCRIPT, when none of the calls ran).  Calls are
    added in groups, each read by its own parser: :meth:`execute` returns one value per
    group.
    """

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._calls: list[Call] = []
        self._groups: list[tuple[int, int, Callable[[list[Any]], Any]]] = []

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, parse: Callable[[list[Any]], Any], *calls: Call) -> None:
        """Queue ``calls``; their replies, in order, go to ``parse``."""
        start = len(self._calls)
        self._calls.extend(calls)
        self._groups.append((start, len(self._calls), parse))

    def execute(self, *then: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """Run the queued calls, then the commands ``then`` (WAIT, say), in one round trip;
        returns the value of each group and the replies of ``then``."""
        if not self._calls:
            return [], [self.client.execute_command(*command) for command in then]  # type: ignore[no-untyped-call]
        self._load(known=True)
        replies = self._send(then)
        count = len(self._calls)
        lost = [isinstance(reply, NoScriptError) for reply in replies[:count]]
        if any(lost):
            if not all(lost):
                _LOADED.pop(self.client, None)  # the next call asks Redis what it holds
                raise ScriptsLost("Redis dropped its scripts while a chain of them ran")
            self._load(known=False)
            replies = self._send(then)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        values = [parse(replies[start:end]) for start, end, parse in self._groups]
        return values, replies[count:]

    def _send(self, then: Iterable[Sequence[Any]]) -> list[Any]:
        pipe: Any = self.client.pipeline(transaction=False)
        for call in self._calls:
            pipe.execute_command("EVALSHA", call.bound.sha, len(call.keys), *call.keys, *call.argv)
        for command in then:
            pipe.execute_command(*command)
        return list(pipe.execute(raise_on_error=False))

    def _load(self, *, known: bool) -> None:
        """Load the chain's scripts Redis may not hold (``known``: trust what this process
        loaded before, else ask)."""
        loaded = _LOADED.setdefault(self.client, set())
        if not known:
            loaded.clear()
        scripts = {call.bound.sha: call.bound.script for call in self._calls}
        missing = [sha for sha in scripts if sha not in loaded]
        if not missing:
            return
        held = self.client.script_exists(*missing)
        for sha, present in zip(missing, held, strict=True):
            if not present:
                self.client.script_load(scripts[sha].source)
            loaded.add(sha)


#: The package's scripts.
LIBRARY = Library(ROOT)


def source(name: str) -> str:
    """The assembled source of the package's script ``name`` (``"pools/take"``)."""
    return LIBRARY.source(name)


def names() -> list[str]:
    """The names of every script of the package."""
    return LIBRARY.names()


def text(value: Any) -> str:
    """A reply value as ``str`` (clients without ``decode_responses`` return bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def ms(seconds: float) -> int:
    return int(seconds * 1000)

"""Every Lua script of the package is called by name, says what it takes and returns, and
takes ``now`` from the one prologue."""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import Any

import captcha_tasks
from captcha_tasks.keys import Keys
from captcha_tasks.state.db import Db
from captcha_tasks.state.lua import NOW_MS, Lib, Script


def scripts() -> dict[str, Script]:
    found = {}
    for info in pkgutil.walk_packages(captcha_tasks.__path__, "captcha_tasks."):
        if info.name.endswith(("sessions", "cli", "__main__")) or ".kafka" in info.name:
            continue  # deprecated shims warn; the CLI and Kafka are checked by their tests
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, Script):
                found[f"{module.__name__}.{name}"] = value
    return found


def _keys(lib: Lib) -> set[str]:
    """The keys of a fragment and of the fragments it needs."""
    return {*lib.keys, *(key for need in lib.needs for key in _keys(need))}


def test_there_are_scripts_to_check() -> None:
    assert {
        "captcha_tasks.state.limiter.ADMIT",
        "captcha_tasks.state.board.FINISH",
        "captcha_tasks.state.pools.TAKE",
    } <= set(scripts())


def test_every_script_documents_its_keys_arguments_and_reply() -> None:
    for name, script in scripts().items():
        header = script.header
        assert "-- returns " in header, name
        assert re.search(r"^-- A[.( ]", header, re.MULTILINE), name
        named = {key for lib in script.libs if lib.name in header for key in _keys(lib)}
        for key in script.keys:
            # each key by name, or the fragment (Lib) that owns it
            assert f"K.{key}" in header or key in named, (name, key)


def test_keys_are_used_by_name_never_by_position() -> None:
    for name, script in scripts().items():
        body = script.source.split("local A = cjson.decode(ARGV[1])", 1)[1]
        assert "KEYS[" not in body and "ARGV[" not in body, name


def test_time_comes_from_the_one_prologue() -> None:
    for name, script in scripts().items():
        assert script.source.count("redis.call('TIME')") == 1, name
        assert NOW_MS in script.source, name


def test_a_fragment_is_included_once_with_what_it_needs() -> None:
    base = Lib("BASE", "local function base_fn() return 1 end\n", keys=("a",))
    top = Lib("TOP", "local function top_fn() return base_fn() end\n", ("b",), needs=(base,))
    script = Script("-- test\n-- A (nothing)\n-- returns 2", libs=(top, base), body="return 2")
    assert script.source.count("base_fn() return 1") == 1
    assert script.source.index("base_fn() return 1") < script.source.index("top_fn()")
    assert script.keys == ("a", "b")  # in the order the fragments are included


def test_a_script_runs_with_keys_and_arguments_by_name(redis_conn: Any, keys: Keys) -> None:
    script = Script(
        "-- set one key\n-- K.target\n-- A.value\n-- returns the value",
        keys=("target",),
        body="redis.call('SET', K.target, A.value) return redis.call('GET', K.target)",
    )
    run = Db(redis_conn, keys).bind(script)
    target = keys.board()
    assert run({"target": target}, {"value": "by name"}) == "by name"
    assert redis_conn.get(target) == "by name"

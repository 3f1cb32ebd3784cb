"""Every Lua script of the state layer says what it takes and returns, and is registered
once per Redis client."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import captcha_tasks.state
from captcha_tasks.state.lua import NOW_MS, script


def scripts() -> dict[str, str]:
    found = {}
    for info in pkgutil.iter_modules(captcha_tasks.state.__path__):
        module = importlib.import_module(f"captcha_tasks.state.{info.name}")
        for name, value in vars(module).items():
            if name.endswith("_LUA") and isinstance(value, str):
                found[f"{info.name}.{name}"] = value
    return found


def test_there_are_scripts_to_check() -> None:
    assert {"limiter.ADMIT_LUA", "board.FINISH_LUA", "pools.TAKE_LUA"} <= set(scripts())


def test_every_script_has_a_keys_argv_returns_header() -> None:
    for name, source in scripts().items():
        header = "\n".join(line for line in source.strip().splitlines() if line.startswith("--"))
        assert "-- KEYS[1] = " in header, name
        assert "-- ARGV" in header, name
        assert "-- returns " in header, name


def test_time_comes_from_the_one_prologue() -> None:
    for name, source in scripts().items():
        if "redis.call('TIME')" in source:
            assert source.count("redis.call('TIME')") == 1 and NOW_MS in source, name


def test_a_script_is_registered_once_per_client(redis_conn: Any) -> None:
    source = scripts()["limiter.RENEW_LUA"]
    assert script(redis_conn, source) is script(redis_conn, source)

"""The Lua scripts are files in one plain format (``captcha_tasks/state/lua``): each says
what it takes and returns, declares every key it touches by name (and no key it does not),
takes ``now`` from the one prologue, and is what Redis runs under the SHA1 the package
prints.  The format's rules and the chains of scripts, against a real Redis."""

from __future__ import annotations

import hashlib
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from captcha_tasks.core.lanes import LANES
from captcha_tasks.errors import StoreUnavailable
from captcha_tasks.state import keys as keys_module
from captcha_tasks.state.batches import STREAM_TTL
from captcha_tasks.state.budgets import DAY_MS
from captcha_tasks.state.db import Db
from captcha_tasks.state.keys import Keys
from captcha_tasks.state.limiter import WAIT_BUCKETS_S
from captcha_tasks.state.lua import (
    LIBRARY,
    ROOT,
    Chain,
    Key,
    Library,
    Script,
    ScriptFormatError,
    ms,
)
from captcha_tasks.state.lua.__main__ import main as print_shas
from captcha_tasks.state.timing import SAMPLE_WINDOW

pytestmark = pytest.mark.redis

_FUNCTION = re.compile(r"^function (\w+)\.(\w+)\(", re.MULTILINE)
_CALL = re.compile(r"\b([a-z_]+)\.([a-z_]+)\(")
_KEY_USE = re.compile(r"\bK\.([a-z_0-9]+)")


def fragment_functions() -> dict[str, tuple[set[str], set[str]]]:
    """Every fragment function (``"slots.drop"``): the keys it reads and what it calls."""
    found: dict[str, tuple[set[str], set[str]]] = {}
    for path in LIBRARY.fragments():
        text = LIBRARY.text(path)
        starts = list(_FUNCTION.finditer(text))
        for n, match in enumerate(starts):
            end = starts[n + 1].start() if n + 1 < len(starts) else len(text)
            body = text[match.end() : end]
            calls = {f"{m[1]}.{m[2]}" for m in _CALL.finditer(body)}
            found[f"{match[1]}.{match[2]}"] = (set(_KEY_USE.findall(body)), calls)
    return found


def body_of(script: Script) -> str:
    """A script's own code, after its includes."""
    return script.text.rsplit("--@include ", 1)[-1].split("\n", 1)[-1]


def keys_used(script: Script) -> set[str]:
    """The keys a script's body reads, and every fragment function it calls does."""
    functions = fragment_functions()
    body = body_of(script)
    used = set(_KEY_USE.findall(body))
    todo = [f"{m[1]}.{m[2]}" for m in _CALL.finditer(body)]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        reads, calls = functions[name]
        used |= reads
        todo.extend(calls)
    return used


@cache
def scripts() -> dict[str, Script]:
    return {name: LIBRARY.script(name) for name in LIBRARY.names()}


def test_there_are_scripts_to_check() -> None:
    assert {
        "limiter/admit_gate",
        "board/finish_claim",
        "pools/take",
        "sessions/save_cookies",
        "sessions/lock_release",
        "kafka/claim",
    } <= set(scripts())
    assert not list(ROOT.glob("*.lua")) and not list(ROOT.glob("*/*/*.lua"))  # one level


def test_no_python_module_of_the_package_holds_lua() -> None:
    for path in ROOT.parent.parent.rglob("*.py"):
        assert "redis.call" not in path.read_text(encoding="utf-8"), path


def test_every_script_documents_what_it_does_its_arguments_and_reply() -> None:
    for name, script in scripts().items():
        header = script.header
        assert len(header.splitlines()) >= 2, name
        assert "\n-- returns " in header, name
        assert re.search(r"^-- A[.( ]", header, re.MULTILINE), name
        if script.key_count > 4:  # many keys: each group says why (a comment before it)
            table = script.text.split("local K = {\n", 1)[1].split("\n}\n", 1)[0]
            assert table.startswith("  --"), name


def test_every_key_a_script_touches_is_declared_and_every_declared_key_touched() -> None:
    for name, script in scripts().items():
        declared = {key.name for key in script.keys}
        used = keys_used(script)
        assert used <= declared, (name, used - declared)
        assert declared <= used, (name, declared - used)


def test_keys_and_arguments_are_used_by_name_never_by_position() -> None:
    for name, script in scripts().items():
        source = script.source
        table = source.split("local K = {\n", 1)[-1].split("\n}\n", 1)[-1]
        assert "KEYS[" not in table, name
        assert source.count("ARGV[") == source.count("local A = cjson.decode(ARGV[1])"), name
        if "A." in body_of(script):
            assert "local A = cjson.decode(ARGV[1])\n" in script.text, name


def test_time_comes_from_the_one_prologue() -> None:
    prologue = LIBRARY.text("lib/now.lua")
    for name, script in scripts().items():
        source = script.source
        code = [line for line in source.replace(prologue, "").splitlines() if "--" not in line]
        uses_now = any(re.search(r"\bnow\b", line) for line in code)
        assert source.count("redis.call('TIME')") == (1 if uses_now else 0), name
        assert (prologue in source) == uses_now, name


def test_the_prologue_carries_the_test_clock_offset_under_its_key() -> None:
    prologue = LIBRARY.text("lib/now.lua")
    offset = (
        f"now = now + (tonumber(redis.call('GET', '{keys_module.TEST_CLOCK_OFFSET_KEY}')) or 0)\n"
    )
    assert prologue.endswith(offset)


def test_fragments_define_their_table_and_read_no_arguments() -> None:
    names = set()
    for path in LIBRARY.fragments():
        name = Path(path).stem
        names.add(name)
        text = LIBRARY.text(path)
        code = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
        assert re.findall(r"^local (\w+)", code, re.MULTILINE) == [name], path
        assert not re.search(r"\bA\.|\bKEYS\b|\bARGV\b", code), path
        for function in _FUNCTION.finditer(text):
            assert function[1] == name, (path, function[0])
    luacheckrc = (ROOT.parents[2] / ".luacheckrc").read_text()
    listed = re.search(r"local fragments = \{(.*?)\}", luacheckrc, re.S)
    assert listed is not None
    assert set(re.findall(r'"(\w+)"', listed[1])) == names


def test_the_lua_literals_are_the_python_constants() -> None:
    def literal(path: str, name: str) -> str:
        found = re.search(rf"^{re.escape(name)} = (.+?)\n(?=\S)", LIBRARY.text(path), re.M | re.S)
        assert found is not None, (path, name)
        return found[1]

    assert re.findall(r"'(\w+)'", literal("lib/slots.lua", "slots.LANES")) == list(LANES)
    bounds = [int(b) for b in re.findall(r"\d+", literal("lib/slots.lua", "slots.WAIT_BOUNDS"))]
    assert bounds == [ms(b) for b in WAIT_BUCKETS_S]
    assert int(literal("lib/budget.lua", "budget.DAY_MS")) == DAY_MS
    assert int(literal("lib/times.lua", "times.WINDOW")) == SAMPLE_WINDOW
    assert int(literal("lib/batch.lua", "batch.STREAM_TTL_S")) == STREAM_TTL
    [queues] = [k for k in Script("owed/sweep").keys if k.name == "solve_queues"]
    assert queues.size == len(LANES)  # one solve queue per lane


# -- the format --------------------------------------------------------------------------


def library(tmp_path: Path, files: dict[str, str]) -> Library:
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return Library(tmp_path)


def test_assembly_includes_each_fragment_once_in_the_order_first_named(tmp_path: Path) -> None:
    lib = library(
        tmp_path,
        {
            "lib/base.lua": "local base = {}\n",
            "lib/top.lua": "--@include lib/base.lua\nlocal top = {}\n",
            "lib/side.lua": "--@include lib/base.lua\nlocal side = {}\n",
            "m/run.lua": "-- run\n--@include lib/top.lua\n--@include lib/side.lua\n"
            "--@include lib/base.lua\nreturn 1\n",
        },
    )
    assert lib.names() == ["m/run"]
    assert lib.fragments() == ["lib/base.lua", "lib/side.lua", "lib/top.lua"]
    assert lib.source("m/run") == (
        "-- run\nlocal base = {}\nlocal top = {}\nlocal side = {}\nreturn 1\n"
    )
    assert lib.script("m/run").sha == hashlib.sha1(lib.source("m/run").encode()).hexdigest()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("--@include lib/none.lua\n", "no such file"),
        ("--@include ../secrets.lua\n", "cannot include"),
        ("local K = {\n  a = KEYS[2],\n}\n", "expected KEYS[1]"),
        ("local K = {\n  a = {KEYS[1], KEYS[2]},\n  b = KEYS[3],\n}\n", "must come last"),
        ("local K = {\n  a = {KEYS[1], KEYS[3]},\n}\n", "a list of keys"),
        ("local K = {\n  a = KEYS[1]\n", "no closing line"),
        ("local K = {\n  a = 'x',\n}\n", "not a key entry"),
        ("return 1", "must end with LF"),
    ],
)
def test_a_file_out_of_format_is_refused_naming_where(
    tmp_path: Path, text: str, problem: str
) -> None:
    lib = library(tmp_path, {"m/bad.lua": text})
    with pytest.raises(ScriptFormatError, match=re.escape(problem)) as info:
        _ = lib.source("m/bad"), lib.script("m/bad").keys
    assert "bad.lua" in str(info.value) or "lib/none.lua" in str(info.value)


def test_the_key_order_is_read_from_the_file() -> None:
    assert Script("owed/sweep").keys[-2:] == (
        Key("submit_queue", 6),
        Key("solve_queues", 7, 3),
    )
    assert Script("owed/sweep").key_count == 9


def runner(tmp_path: Path) -> Library:
    return library(
        tmp_path,
        {
            "lib/now.lua": LIBRARY.text("lib/now.lua"),
            "m/set.lua": """-- Set one key, then every key of a list, to A.value.
-- A.value
-- returns the first key's value and how many keys the list had
local K = {
  target = KEYS[1],
  more = {KEYS[2], KEYS[3]},
}
local A = cjson.decode(ARGV[1])
redis.call('SET', K.target, A.value)
for _, key in ipairs(K.more) do redis.call('SET', key, A.value) end
return {redis.call('GET', K.target), #K.more}
""",
            "m/now.lua": """-- The time.
-- A (nothing)
-- returns now
--@include lib/now.lua
return now
""",
        },
    )


def test_a_script_runs_with_keys_and_arguments_by_name(
    redis_conn: Any, keys: Keys, tmp_path: Path
) -> None:
    run = Db(redis_conn, keys).bind(runner(tmp_path).script("m/set"))
    target, other = keys.board(), keys.poll_due()
    assert run({"target": target, "more": [other], "unused": "x"}, {"value": "v"}) == ["v", 1]
    assert redis_conn.get(other) == "v"
    with pytest.raises(KeyError, match="more"):
        run({"target": target}, {})
    with pytest.raises(TypeError, match="at most 2"):
        run({"target": target, "more": [other] * 3}, {})


def test_the_test_clock_offset_moves_every_script_s_now(
    redis_conn: Any, keys: Keys, tmp_path: Path
) -> None:
    run = Db(redis_conn, keys).bind(runner(tmp_path).script("m/now"))
    before = int(run({}, {}))
    redis_conn.set(keys_module.TEST_CLOCK_OFFSET_KEY, 3_600_000)
    try:
        assert int(run({}, {})) - before >= 3_600_000
    finally:
        redis_conn.delete(keys_module.TEST_CLOCK_OFFSET_KEY)
    assert int(run({}, {})) - before < 3_600_000


def test_every_script_is_loaded_by_redis_under_the_sha_the_package_prints(
    redis_conn: Any,
) -> None:
    printed = CliRunner().invoke(print_shas, [])
    assert printed.exit_code == 0, printed.output
    shas = dict(reversed(line.split("  ")) for line in printed.output.splitlines())
    assert sorted(shas) == LIBRARY.names()
    for name, script in scripts().items():
        assert redis_conn.script_load(script.source) == shas[name] == script.sha, name
        assert script.bind(redis_conn).sha == script.sha, name
    one = CliRunner().invoke(print_shas, ["--source", "pools/take"])
    assert one.output == Script("pools/take").source
    assert CliRunner().invoke(print_shas, ["--source", "nope"]).exit_code != 0


# -- chains -------------------------------------------------------------------------------


def chain_of(redis_conn: Any, keys: Keys, tmp_path: Path, n: int) -> Chain:
    bound = Db(redis_conn, keys).bind(runner(tmp_path).script("m/set"))
    chain = Chain(redis_conn)
    for i in range(n):
        chain.add(
            lambda replies: replies[0][0],
            bound.call({"target": keys.board(), "more": []}, {"value": str(i)}),
        )
    return chain


def test_a_chain_runs_its_calls_in_order_in_one_round_trip(
    redis_conn: Any, keys: Keys, tmp_path: Path
) -> None:
    chain = chain_of(redis_conn, keys, tmp_path, 3)
    chain.execute()  # the scripts are loaded once for this client
    before = redis_conn.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    values, then = chain.execute(("GET", keys.board()))
    assert values == ["0", "1", "2"] and then == ["2"]
    stats = redis_conn.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] - before == 3


def test_a_chain_loads_its_scripts_again_when_redis_forgot_them(
    redis_conn: Any, keys: Keys, tmp_path: Path
) -> None:
    chain = chain_of(redis_conn, keys, tmp_path, 2)
    chain.execute()
    redis_conn.script_flush()  # a restart or a failover forgets every script
    values, _ = chain.execute()
    assert values == ["0", "1"]


def test_a_chain_that_lost_its_scripts_halfway_is_an_outage(
    redis_conn: Any, keys: Keys, tmp_path: Path
) -> None:
    lib = runner(tmp_path)
    db = Db(redis_conn, keys)
    first, second = db.bind(lib.script("m/set")), db.bind(lib.script("m/now"))
    chain = Chain(redis_conn)
    chain.add(list, first.call({"target": keys.board(), "more": []}, {"value": "x"}))
    chain.add(list, second.call({}, {}))
    chain.execute()
    redis_conn.script_flush()
    redis_conn.script_load(lib.script("m/set").source)  # one of the two is back
    with pytest.raises(StoreUnavailable, match="ScriptsLost"):  # an outage to its caller
        db.guard(chain.execute)
    values, _ = chain.execute()  # ... and the next call loads what is missing
    assert values[0] == [["x", 0]]

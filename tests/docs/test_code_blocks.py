"""Every ```python block of README.md and docs/**/*.md runs as written, against the test
stack: a real worker, Redis and the sandbox.

* A block leaves some names to the reader (``rows``, ``use``, ``tasks``, ``login``,
  ``params``): :class:`Reader` provides them, and afterwards checks what the block did
  with them (every outcome handed to ``use`` solved, each index once; a ``result`` or
  ``outcome`` it left solved; a task id it returned solved).
* Top-level ``await`` runs in an event loop; a view's top-level ``return`` runs inside a
  function.
* A block that cannot run here says why in an HTML comment just before it
  (``<!-- not run: needs a Kafka broker -->``): its imports still run, and the rest must
  compile.  Imports of a package the suite keeps in a virtual environment of its own
  (``capmonstercloudclient``, ``tests/pip_cache.py``) run there.  A block that is a file
  of ``examples/`` (``--8<-- "examples/..."``) is run with its app by tests/dev; here it
  must exist and compile.
* Identical blocks (the README and a guide) run once.

Whatever blocks the documentation has, the test finds them: nothing here names one.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from celery.result import AsyncResult
from parsing import parse

from captcha_tasks.settings import get_settings
from captcha_tasks.state.keys import Keys
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker.app import app

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("worker", "clean_state")]

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(
    r"(?:<!--\s*not run:\s*(?P<why>.*?)\s*-->\s*\n)?^```python\n(?P<code>.*?)^```[ \t]*$",
    re.S | re.M,
)
INCLUDE = re.compile(r'^--8<--\s+"(?P<path>[^"]+)"\s*$')
#: Domains whose shared cookies the session examples write (under the environment's prefix).
DOMAINS = ("example.com",)
COUNT = 3
#: Packages kept out of the project's environment: the fixture naming the interpreter of
#: the virtual environment that holds each.
ISOLATED = {"capmonstercloudclient": "capmonster_python"}


@dataclass(frozen=True)
class Block:
    code: str
    why: str | None  #: why it is not run here (None: it runs)
    where: str  #: the first place it appears, ``README.md:145``


def blocks() -> list[Block]:
    found: dict[tuple[str, str | None], Block] = {}
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start("code"))
            where = f"{page.relative_to(ROOT)}:{line}"
            key = (match["code"], match["why"])
            found.setdefault(key, Block(match["code"], match["why"], where))
    return list(found.values())


@dataclass
class Reader:
    """The names a block leaves to the reader, and what the block did with them."""

    used: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    logins: int = 0

    def namespace(self) -> dict[str, Any]:
        page = "https://example.com/readme"
        keys = [f"0x4AAAAAAAreadme{i}" for i in range(COUNT)]
        return {
            "__name__": "__readme__",
            "rows": [(key, f"{page}/{i}") for i, key in enumerate(keys)],
            "tasks": [{"method": "turnstile", "sitekey": k, "pageurl": page} for k in keys],
            "params": {"method": "turnstile", "sitekey": keys[0], "pageurl": page},
            "use": self.use,
            "login": self.login,
        }

    def use(self, index: int, result: dict[str, Any]) -> None:
        self.used.append((index, result))

    def login(self) -> dict[str, str]:
        self.logins += 1
        return {"session": uuid.uuid4().hex}

    def check(self, names: dict[str, Any], returned: Any) -> None:
        if self.used:
            assert sorted(index for index, _ in self.used) == list(range(COUNT))
            assert [r["status"] for _, r in self.used] == ["solved"] * COUNT, self.used
        for name in ("result", "outcome"):
            _check_solved(names.get(name))
        if isinstance(returned, tuple) and len(returned) == 2 and isinstance(returned[1], int):
            body, status = returned
            assert status < 400, returned
            if isinstance(body, dict) and "task_id" in body:
                _check_solved(AsyncResult(body["task_id"], app=app))


def _check_solved(value: Any) -> None:
    if isinstance(value, AsyncResult):
        value = value.get(timeout=60)
    if isinstance(value, dict) and "status" in value:
        assert value["status"] == "solved", value


def compiled(block: Block) -> tuple[Any, bool]:
    """The block's code object, and whether it is the body of a function to call (a view's
    top-level ``return``)."""
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        return compile(block.code, block.where, "exec", flags=flags), False
    except SyntaxError as exc:
        if "'return' outside function" not in str(exc):
            raise
    body = "def __example__():\n" + textwrap.indent(block.code, "    ")
    return compile(body, block.where, "exec"), True


@pytest.fixture
def settled(redis_conn: Any, env: dict[str, str]) -> Iterator[None]:
    """Whatever a block started (pool refills, say) finishes before the next test, whose
    ``clean_state`` wipes the keys of anything still running.  Not only the threads: a
    pool's top-up message may not have run yet when the block returns (a CI run's refills
    of the pools guide's block started after it and were wiped mid-flight)."""
    yield
    limiter = app.runtime().state.limiter
    prefix = env["CAPTCHAAI_QUEUE_PREFIX"]

    def quiet() -> bool:
        # kombu: the Redis transport's queues (lists named after them, with priority
        # suffixes) and its ``unacked`` hash (a message a worker took and has not acked)
        queued = sum(redis_conn.llen(k) for k in redis_conn.scan_iter(f"{prefix}.*", _type="list"))
        taken = any(prefix in message for message in redis_conn.hvals("unacked"))
        waiting = limiter.parked_count() + limiter.deferred_count()
        return not queued and not taken and not waiting and limiter.in_use() == 0

    wait_until(quiet, 30, what="every message run and every thread given back")


@pytest.fixture
def shared_cookies(redis_conn: Any) -> Iterator[None]:
    """``CookieStore.from_settings()`` writes under the environment's key prefix: cleaned."""
    yield
    keys = Keys(get_settings().redis.key_prefix)
    for domain in DOMAINS:
        redis_conn.delete(keys.cookies(domain), keys.session_lock(domain))
        redis_conn.delete(keys.session_version(domain))


def _runnable() -> list[Block]:
    return [b for b in blocks() if b.why is None and not INCLUDE.match(b.code.strip())]


def _not_run() -> list[Block]:
    return [b for b in blocks() if b not in _runnable()]


@pytest.mark.parametrize("block", _runnable(), ids=lambda b: b.where)
def test_the_block_runs(block: Block, sandbox: Any, settled: None, shared_cookies: None) -> None:
    code, wrapped = compiled(block)
    reader = Reader()
    names = reader.namespace()
    exec_or_await(code, names)
    returned = names["__example__"]() if wrapped else None
    reader.check(names, returned)


@pytest.mark.parametrize("block", _not_run(), ids=lambda b: b.where)
def test_a_block_not_run_here_says_why_and_its_imports_work(
    block: Block, request: pytest.FixtureRequest
) -> None:
    include = INCLUDE.match(block.code.strip())
    if include:  # a file of examples/, run with its app by tests/dev
        path = ROOT / include["path"]
        assert path.is_file(), f"{block.where} includes {path}, which does not exist"
        compile(path.read_text(encoding="utf-8"), str(path), "exec")
        return
    assert block.why, f"{block.where}: say why it is not run"
    compiled(block)
    tree = parse(block.code)
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    assert imports, f"{block.where} is not run and imports nothing: nothing is checked"
    elsewhere = {ISOLATED[name] for name in _top_modules(imports) if name in ISOLATED}
    if not elsewhere:
        exec(compile(ast.Module(imports, []), block.where, "exec"), {})
        return
    [fixture] = elsewhere
    python = request.getfixturevalue(fixture)
    source = ast.unparse(ast.Module(imports, []))
    run = subprocess.run([python, "-c", source], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"{block.where}: its imports fail in {python}:\n{run.stderr}"


def _top_modules(imports: list[ast.stmt]) -> set[str]:
    names = set()
    for node in imports:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def exec_or_await(code: Any, names: dict[str, Any]) -> None:
    if code.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(code, names))  # top-level await: the block is a coroutine
    else:
        exec(code, names)


def test_the_readme_has_blocks_that_run() -> None:
    assert any(b.where.startswith("README.md:") for b in _runnable())

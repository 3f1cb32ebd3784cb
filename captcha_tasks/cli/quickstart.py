"""``captcha-tasks quickstart``: a whole local stack and a demo batch, in one command.

Uses ``REDIS_URL`` if it answers, otherwise starts a Redis-compatible server that pip
installed; starts the sandbox API when ``CAPTCHAAI_API_KEY`` is not set; starts a worker
and beat; solves a demo batch printing each token as it arrives.  Every process it
started is stopped on exit, Ctrl-C, SIGTERM or SIGHUP (a closed terminal).

Its logs go to one folder, :func:`quickstart_dir` (emptied at the start of each run, kept
after it); with ``--keep-running`` the stack's settings are written there as
``quickstart.env`` (``export`` lines to ``source`` in another shell), deleted when the
stack stops.  The processes are :mod:`captcha_tasks.testing`'s.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import click
import requests

from .. import settings
from ..settings import mask_url
from ..state import connections
from ..testing.processes import CeleryProcess, RedisServer
from ..testing.sandbox import SandboxConfig, SandboxServer
from ..worker.app import app
from ..worker.broker import backend_url, transport
from ..worker.tasks import solve

DEMO_PAGE = "https://example.com/quickstart"
DEMO_TASKS: list[dict[str, Any]] = [
    {"method": "turnstile", "sitekey": "0x4AAAAAAADemoTurnstile", "pageurl": DEMO_PAGE},
    {"method": "userrecaptcha", "sitekey": "6LeDemoRecaptchaV2", "pageurl": DEMO_PAGE},
    {
        "method": "userrecaptcha",
        "sitekey": "6LeDemoRecaptchaV3",
        "pageurl": DEMO_PAGE,
        "version": "v3",
        "action": "login",
        "min_score": 0.7,
    },
]

Echo = Callable[[str], None]
ENV_FILE = "quickstart.env"
#: Signals that stop the stack like Ctrl-C: ``kill``, and a closed terminal.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def quickstart_dir() -> Path:
    """The quickstart's one folder: logs of the last run and, while a stack is kept
    running, its ``quickstart.env`` (``$XDG_CACHE_HOME/captcha-tasks/quickstart``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "captcha-tasks" / "quickstart"


def fresh_dir(path: Path) -> Path:
    """``path``, emptied: each run's logs replace the last run's."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def stop_signals_interrupt(signals: Sequence[signal.Signals] = STOP_SIGNALS) -> Iterator[None]:
    """While inside, ``signals`` raise KeyboardInterrupt, so they stop the stack the way
    Ctrl-C does (its processes run in sessions of their own: a closed terminal's SIGHUP
    never reaches them).  A second signal during the clean-up is ignored."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, interrupt) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class Stack:
    """The processes and servers one quickstart run started."""

    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    sandbox: SandboxServer | None = None
    processes: list[Any] = field(default_factory=list)
    env_file: Path | None = None

    def stop(self) -> None:
        if self.env_file is not None:
            self.env_file.unlink(missing_ok=True)
        for proc in reversed(self.processes):
            proc.stop()
        if self.sandbox is not None:
            self.sandbox.stop()

    def dead(self) -> str | None:
        """The first process of the stack that exited on its own, said in a few words (its
        log path included); None while all run.  Asking reaps it: no zombie is left."""
        for proc in self.processes:
            if not proc.alive():
                code = proc.proc.returncode if proc.proc is not None else None
                return f"{proc.name} exited (code {code}; log: {proc.log_path})"
        return None

    def exports(self) -> list[str]:
        """What another shell needs to use this stack, as ``export`` lines; secrets of
        the user's own environment (an API key, a Redis password) are not repeated."""
        current = settings.get_settings()
        url = self.env["REDIS_URL"]
        if _has_password(url):  # only the user's own URL has one: it is in their shell
            lines = ["# REDIS_URL: yours, with its password (already in your environment)"]
        else:
            lines = [_export("REDIS_URL", url)]
        lines.append(_export("CAPTCHAAI_BASE_URL", current.providers.base_url))
        if self.sandbox is not None:
            lines.append(_export("CAPTCHAAI_API_KEY", self.env["CAPTCHAAI_API_KEY"]))
        else:
            lines.append("# CAPTCHAAI_API_KEY: yours (already in your environment)")
        lines.append(_export("CAPTCHAAI_THREADS", str(current.providers.threads)))
        for var in (
            "CAPTCHAAI_KEY_PREFIX",
            "CAPTCHAAI_QUEUE_PREFIX",
            "REDIS_SENTINEL_MASTER",
            "REDIS_SENTINEL_TLS",
            "REDIS_SENTINEL_TLS_CA_FILE",
        ):
            if os.environ.get(var):
                lines.append(_export(var, os.environ[var]))
        if os.environ.get("REDIS_SENTINEL_PASSWORD"):
            lines.append("# REDIS_SENTINEL_PASSWORD: yours (already in your environment)")
        return lines

    def write_env_file(self, path: Path) -> Path:
        """Write :meth:`exports` to ``path`` (owner-only: it may hold the sandbox's key)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write("# captcha-tasks quickstart: the running stack's settings\n")
            out.write("".join(line + "\n" for line in self.exports()))
        self.env_file = path
        return path


def _export(var: str, value: str) -> str:
    return f"export {var}={shlex.quote(value)}"


def _has_password(url: str) -> bool:
    return bool(urlsplit(url).password)


@contextlib.contextmanager
def running_stack(log_dir: Path, echo: Echo, workers: int = 1) -> Iterator[Stack]:
    """Start what is missing (Redis, sandbox), a worker and beat; stop them all after."""
    stack = Stack(log_dir)
    try:
        _ensure_redis(stack, echo)
        _ensure_api(stack, echo)
        os.environ.update(stack.env)
        _configure_this_process()
        for n in range(workers):
            worker = CeleryProcess("worker", env=stack.env, log_dir=log_dir, name=f"worker{n + 1}")
            stack.processes.append(worker.start())
        beat = CeleryProcess("beat", env=stack.env, log_dir=log_dir, name="beat")
        stack.processes.append(beat.start())
        echo(f"worker and beat running (logs in {log_dir})")
        yield stack
    finally:
        stack.stop()


def _ensure_redis(stack: Stack, echo: Echo) -> None:
    configured = settings.Settings.from_env()  # REDIS_URL, or its sentinels and master
    url = configured.redis.url
    if connections.reachable(configured):
        echo(f"using Redis at {mask_url(url)}")
        stack.env["REDIS_URL"] = url
        return
    server = RedisServer(log_dir=stack.log_dir).start()
    stack.processes.append(server)
    stack.env["REDIS_URL"] = server.url
    echo(f"{mask_url(url)} not reachable: started a local server at {server.url}")


def _ensure_api(stack: Stack, echo: Echo) -> None:
    if os.environ.get("CAPTCHAAI_API_KEY"):
        echo("using the CaptchaAI API at " + os.environ.get("CAPTCHAAI_BASE_URL", "(default)"))
        return
    key = "sandbox-" + secrets.token_hex(8)
    config = SandboxConfig(threads=15, solve_time=1.5, jitter=0.3, api_keys=(key,))
    stack.sandbox = SandboxServer(config).start()
    stack.env.update(
        CAPTCHAAI_API_KEY=key,
        CAPTCHAAI_BASE_URL=stack.sandbox.url,
        CAPTCHAAI_THREADS=os.environ.get("CAPTCHAAI_THREADS", "15"),
        CAPTCHAAI_POLL_INTERVAL=os.environ.get("CAPTCHAAI_POLL_INTERVAL", "0.5"),
        CAPTCHAAI_INITIAL_WAIT=os.environ.get("CAPTCHAAI_INITIAL_WAIT", "1"),
    )
    echo(f"no CAPTCHAAI_API_KEY: started the sandbox API at {stack.sandbox.url}")


def _configure_this_process() -> None:
    # This process solves the demo batch with the stack's settings.
    settings.reset_settings()
    current = app.use(settings.get_settings()).settings
    where = connections.celery_options(current)
    app.conf.update(
        where,
        broker_transport=transport(where["broker_url"]),
        result_backend=backend_url(where["result_backend"]),
    )


def demo_batch(count: int, echo: Echo, verify_url: str | None, timeout: float = 120) -> int:
    """Solve ``count`` demo captchas, printing each as it arrives; returns failures."""

    pending = {solve.delay(**DEMO_TASKS[i % len(DEMO_TASKS)]): i for i in range(count)}
    failures = 0
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for res in [r for r in pending if r.ready()]:
            index = pending.pop(res)
            failures += _report_one(res, index, echo, verify_url)
        time.sleep(0.05)
    for index in pending.values():
        echo(f"[{index:>2}] timed out")
    return failures + len(pending)


def _report_one(res: Any, index: int, echo: Echo, verify_url: str | None) -> int:

    if res.failed():
        echo(f"[{index:>2}] FAILED {res.result}")
        return 1
    out = res.result
    token = out["token"]
    shown = token if isinstance(token, dict) else f"{token[:24]}...({len(token)} chars)"
    verdict = ""
    if verify_url and isinstance(token, str):
        ok = requests.post(f"{verify_url}/siteverify", data={"response": token}, timeout=5).json()
        verdict = " siteverify=ok" if ok.get("success") else f" siteverify={ok}"
    echo(f"[{index:>2}] {out['method']:<13} {out['elapsed_s']:5.2f}s {shown}{verdict}")
    return 0


@click.command()
@click.option("--count", default=12, show_default=True, help="Demo captchas to solve.")
@click.option("--keep-running", is_flag=True, help="Keep the stack up after the demo.")
@click.option("--workers", default=1, show_default=True, help="Worker processes to start.")
def quickstart(count: int, keep_running: bool, workers: int) -> None:
    """Start Redis (if needed), the sandbox (if no API key), a worker and beat; solve a demo.

    Logs go to ~/.cache/captcha-tasks/quickstart ($XDG_CACHE_HOME), replaced by each run.
    With --keep-running the stack's settings are written there to quickstart.env, for
    `source` in another shell.  Ctrl-C, SIGTERM or SIGHUP stops every process it started.
    """

    stopped = None
    log_dir = fresh_dir(quickstart_dir())
    click.echo(f"logs in {log_dir} (kept until the next quickstart)")
    with stop_signals_interrupt(), running_stack(log_dir, click.echo, workers=workers) as stack:
        verify = stack.sandbox.url if stack.sandbox else None
        started = time.monotonic()
        failures = demo_batch(count, click.echo, verify)
        click.echo(
            f"{count - failures}/{count} solved in {time.monotonic() - started:.1f}s"
            + (f", {failures} failed" if failures else "")
        )
        if not keep_running:
            click.echo(NEXT_STEPS)
        else:
            env_file = stack.write_env_file(log_dir / ENV_FILE)
            exports = "".join(f"\n  {line}" for line in stack.exports())
            click.echo(
                f"stack running. In another shell, point captcha-tasks and your app at it:\n"
                f"  source {env_file}\nor paste:{exports}\n{WHILE_RUNNING}\n"
                "Ctrl-C, SIGTERM or closing this terminal stops it."
            )
            stopped = _watch(stack)
    if failures or stopped:
        sys.exit(1)


#: What to try once the demo solved.
NEXT_STEPS = """next:
  captcha-tasks quickstart --keep-running   (./scripts/quickstart --keep-running) keeps this
      stack up for your app, Flower and the metrics exporter, and prints how to use it
  docs/getting-started.md                   the rest: your app, batches, pools, operations"""
#: What runs against a kept stack, from another shell that sourced its settings.
WHILE_RUNNING = """then, for example:
  captcha-tasks solve --method turnstile --sitekey 0x4AAA --pageurl https://example.com
  FLOWER_BASIC_AUTH=me:secret celery -A captcha_tasks flower --address=127.0.0.1
  captcha-tasks metrics --port 9808"""


def _watch(stack: Stack) -> str | None:
    """Wait until Ctrl-C (None) or until one of the stack's processes dies (its name): then
    say so, and the stack stops."""
    try:
        while True:
            dead = stack.dead()
            if dead is not None:
                click.echo(f"{dead}: stopping the stack", err=True)
                return dead
            time.sleep(0.5)  # several children: poll them
    except KeyboardInterrupt:
        click.echo("stopping")
        return None

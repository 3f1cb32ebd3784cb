"""``captcha-tasks quickstart``: the local stack and a demo batch."""

from __future__ import annotations

import sys
import time

import click

from ..dev.quickstart import (
    ENV_FILE,
    Stack,
    demo_batch,
    fresh_dir,
    quickstart_dir,
    running_stack,
    stop_signals_interrupt,
)


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

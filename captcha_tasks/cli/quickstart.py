"""``captcha-tasks quickstart``: the local stack and a demo batch."""

from __future__ import annotations

import sys
import time

import click

from ..dev.quickstart import (
    ENV_FILE,
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
        if keep_running:
            env_file = stack.write_env_file(log_dir / ENV_FILE)
            exports = "".join(f"\n  {line}" for line in stack.exports())
            click.echo(
                f"stack running. In another shell, point captcha-tasks and your app at it:\n"
                f"  source {env_file}\nor paste:{exports}\n"
                "Ctrl-C, SIGTERM or closing this terminal stops it."
            )
            _wait_forever()
    if failures:
        sys.exit(1)


def _wait_forever() -> None:
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        click.echo("stopping")

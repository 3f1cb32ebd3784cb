"""The ``captcha-tasks`` command: thin wrappers over the library."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from .errors import CaptchaTasksError


def main() -> None:
    """Entry point: one clear line and an exit code for our errors, not a traceback."""
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except CaptchaTasksError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


@click.group()
def cli() -> None:
    """CaptchaAI solving as Celery tasks shared by many workers."""


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8765, show_default=True, type=int)
@click.option("--threads", default=15, show_default=True, type=int, help="Provider threads.")
@click.option("--solve-time", default=1.5, show_default=True, type=float, help="Mean seconds.")
@click.option("--jitter", default=0.3, show_default=True, type=float, help="± seconds.")
@click.option("--unsolvable-rate", default=0.0, show_default=True, type=float)
@click.option("--error-rate", default=0.0, show_default=True, type=float)
@click.option("--no-bulk", is_flag=True, help="Ignore res.php?ids= like a server without it.")
@click.option("--thread-error", default="ERROR_NO_SLOT_AVAILABLE", show_default=True)
@click.option("--token-ttl", type=float, default=None, help="Token life for every method.")
@click.option("--api-key", "api_keys", multiple=True, help="Accepted key(s).")
def sandbox(
    host: str,
    port: int,
    threads: int,
    solve_time: float,
    jitter: float,
    unsolvable_rate: float,
    error_rate: float,
    no_bulk: bool,
    thread_error: str,
    token_ttl: float | None,
    api_keys: tuple[str, ...],
) -> None:
    """Run a local CaptchaAI-compatible API (for development, tests and benchmarks)."""
    from .sandbox import DEFAULT_TOKEN_TTL, SandboxConfig, serve

    options: dict[str, Any] = {
        "threads": threads,
        "solve_time": solve_time,
        "jitter": jitter,
        "unsolvable_rate": unsolvable_rate,
        "error_rate": error_rate,
        "bulk": not no_bulk,
        "thread_error": thread_error,
    }
    if token_ttl is not None:
        options["token_ttl"] = {m: token_ttl for m in DEFAULT_TOKEN_TTL}
    if api_keys:
        options["api_keys"] = api_keys
    try:
        config = SandboxConfig(**options)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    serve(host, port, config)


@cli.command()
@click.option("--count", default=12, show_default=True, help="Demo captchas to solve.")
@click.option("--keep-running", is_flag=True, help="Keep the stack up after the demo.")
@click.option("--workers", default=1, show_default=True, help="Worker processes to start.")
def quickstart(count: int, keep_running: bool, workers: int) -> None:
    """Start Redis (if needed), the sandbox (if no API key), a worker and beat; solve a demo."""
    from .quickstart import demo_batch, running_stack

    log_dir = Path(tempfile.mkdtemp(prefix="captcha-tasks-quickstart-"))
    with running_stack(log_dir, click.echo, workers=workers) as stack:
        verify = stack.sandbox.url if stack.sandbox else None
        started = time.monotonic()
        failures = demo_batch(count, click.echo, verify)
        click.echo(
            f"{count - failures}/{count} solved in {time.monotonic() - started:.1f}s"
            + (f", {failures} failed" if failures else "")
        )
        if keep_running:
            click.echo(f"stack running: REDIS_URL={stack.env['REDIS_URL']} (Ctrl-C stops it)")
            _wait_forever()
    if failures:
        sys.exit(1)


def _wait_forever() -> None:
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        click.echo("stopping")


@cli.command("solve")
@click.option("--method", required=True, help="userrecaptcha, turnstile, geetest or base64.")
@click.option("--sitekey", default=None)
@click.option("--pageurl", default=None)
@click.option("--param", "params", multiple=True, metavar="K=V", help="Extra API parameter.")
@click.option("--timeout", default=300.0, show_default=True, type=float)
@click.option("--json", "as_json", is_flag=True, help="Print the whole result as JSON.")
def solve_command(
    method: str,
    sitekey: str | None,
    pageurl: str | None,
    params: tuple[str, ...],
    timeout: float,
    as_json: bool,
) -> None:
    """Solve one captcha through the workers and print its token."""
    from .tasks import solve

    extra = dict(_split_param(p) for p in params)
    result = solve.delay(method=method, sitekey=sitekey, pageurl=pageurl, **extra).get(
        timeout=timeout
    )
    token = result["token"]
    click.echo(
        json.dumps(result) if as_json else (json.dumps(token) if isinstance(token, dict) else token)
    )


def _split_param(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise click.BadParameter(f"expected K=V, got {text!r}", param_hint="--param")
    key, value = text.split("=", 1)
    return key.strip(), value


@cli.command()
def account() -> None:
    """Print the account's balance and, where the API answers it, its thread usage."""
    from . import store

    client = store.api_client()
    click.echo(f"balance: {client.balance():.4f}")
    info = client.threads_info()
    if info:
        click.echo(f"threads: {info.get('working_threads', '?')}/{info['threads']} in use")

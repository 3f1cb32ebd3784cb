"""``captcha-tasks sandbox``: the local CaptchaAI-compatible API, from the command line."""

from __future__ import annotations

from typing import Any

import click

from .sandbox import DEFAULT_TOKEN_TTL, SandboxConfig, serve

#: The key the sandbox accepts unless given --api-key.
SANDBOX_KEY = SandboxConfig().api_keys[0]
SANDBOX_HELP = f"""Run a local CaptchaAI-compatible API (for development, tests and benchmarks).

\b
Point workers and captcha-tasks commands at it:
  export CAPTCHAAI_BASE_URL=http://127.0.0.1:8765   # its --host and --port
  export CAPTCHAAI_API_KEY={SANDBOX_KEY}             # an --api-key it accepts
"""


@click.command(help=SANDBOX_HELP)
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
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    help=f"Accepted key (repeatable; default: {SANDBOX_KEY}).",
)
@click.option("--seed", type=int, default=None, help="Seed of its randomness (repeatable runs).")
@click.option(
    "--pingback-method",
    type=click.Choice(["GET", "POST"]),
    default="GET",
    show_default=True,
    help="Callbacks as CaptchaAI (GET) or 2captcha (POST, registered addresses only).",
)
@click.option("--pingback-delay", default=0.0, show_default=True, type=float, help="Seconds.")
@click.option("--pingback-drop-rate", default=0.0, show_default=True, type=float)
@click.option("--hang-rate", default=0.0, show_default=True, type=float, help="Requests that hang.")
@click.option("--hang-s", default=60.0, show_default=True, type=float, help="How long they hang.")
@click.option("--status-429-rate", default=0.0, show_default=True, type=float)
@click.option("--retry-after", default=2, show_default=True, type=int, help="429's Retry-After.")
@click.option(
    "--queue-silently", is_flag=True, help="Beyond the plan, queue captchas instead of an error."
)
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
    seed: int | None,
    pingback_method: str,
    pingback_delay: float,
    pingback_drop_rate: float,
    hang_rate: float,
    hang_s: float,
    status_429_rate: float,
    retry_after: int,
    queue_silently: bool,
) -> None:
    """Run a local CaptchaAI-compatible API (for development, tests and benchmarks)."""

    options: dict[str, Any] = {
        "threads": threads,
        "solve_time": solve_time,
        "jitter": jitter,
        "unsolvable_rate": unsolvable_rate,
        "error_rate": error_rate,
        "bulk": not no_bulk,
        "thread_error": thread_error,
        "seed": seed,
        "pingback_method": pingback_method,
        "pingback_delay": pingback_delay,
        "pingback_drop_rate": pingback_drop_rate,
        "hang_rate": hang_rate,
        "hang_s": hang_s,
        "status_429_rate": status_429_rate,
        "retry_after": retry_after,
        "queue_silently": queue_silently,
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

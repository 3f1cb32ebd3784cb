"""``captcha-tasks sandbox``: one or more local CaptchaAI-compatible providers.

Every option is a :class:`~.sandbox.SandboxConfig` field for every provider; ``--provider``
or ``--providers-file`` make several, each an account of its own on a port of its own.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from ..serving.options import option_group
from .sandbox import (
    DEFAULT_TOKEN_TTL,
    FIRST_CAPTCHA_ID,
    OUTAGE_MODES,
    SANDBOX_KINDS,
    SandboxConfig,
    serve,
)

__all__ = ["PROVIDER_ID_SPAN", "SANDBOX_KEY", "provider_configs", "sandbox"]

#: The key the sandbox accepts unless given --api-key.
SANDBOX_KEY = SandboxConfig().api_keys[0]
DEFAULT_PORT = 8765
#: Provider n (from 0) numbers its captchas from ``--first-id`` + n × this, unless
#: ``--colliding-ids``: then they all start at ``--first-id``.
PROVIDER_ID_SPAN = 10_000_000
#: What ``--providers-file`` entries may hold: ``port`` and the config's fields.
_ENTRY_FIELDS = frozenset({"port"} | {f.name for f in dataclasses.fields(SandboxConfig)})

SANDBOX_HELP = f"""Run a local CaptchaAI-compatible API (for development, tests and benchmarks).

\b
Point workers and captcha-tasks commands at it:
  export CAPTCHAAI_BASE_URL=http://127.0.0.1:8765   # its --host and --port
  export CAPTCHAAI_API_KEY={SANDBOX_KEY}             # an --api-key it accepts

\b
Several providers, each an account of its own (threads, balance, ids, counters):
  captcha-tasks sandbox --provider primary:8765:KEY1:15 --provider backup:8766:KEY2
  captcha-tasks sandbox --providers-file providers.json   # per-provider fields too
Every other option applies to each of them; POST /sandbox/config on a provider's port
changes its faults while it runs.
"""


#: Where the providers listen, how many, and their captcha ids.
_PROVIDERS_OPTIONS = [
    click.option("--host", default="127.0.0.1", show_default=True),
    click.option(
        "--port", default=None, type=int, help=f"One provider's port  [default: {DEFAULT_PORT}]"
    ),
    click.option(
        "--provider",
        "provider_specs",
        multiple=True,
        metavar="NAME:PORT:KEY[:THREADS]",
        help="A provider of its own (repeatable); replaces --port and --api-key.",
    ),
    click.option(
        "--providers-file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help='JSON list of providers: {"name", "port", any config field, e.g. "api_keys", '
        '"kind", "threads", "solve_time", "balance_captchas", "outage_mode"}; options are the'
        " defaults.",
    ),
    click.option(
        "--kind",
        type=click.Choice(SANDBOX_KINDS),
        default="captchaai",
        show_default=True,
        help="The protocol each provider speaks: in.php (captchaai, 2captcha) or a JSON dialect.",
    ),
    click.option(
        "--colliding-ids", is_flag=True, help="Every provider issues the same captcha ids."
    ),
    click.option(
        "--first-id",
        default=FIRST_CAPTCHA_ID,
        show_default=True,
        type=int,
        help=f"First captcha id (provider n: + n × {PROVIDER_ID_SPAN:,}).",
    ),
    click.option(
        "--journal-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Append each captcha accepted (paid) to DIR/NAME.paid.jsonl: it survives a SIGKILL.",
    ),
]


#: The faults and plan of every provider: each option is the SandboxConfig field it names.
_CONFIG_OPTIONS = [
    click.option("--threads", default=15, show_default=True, type=int, help="Provider threads."),
    click.option("--solve-time", default=1.5, show_default=True, type=float, help="Mean seconds."),
    click.option("--jitter", default=0.3, show_default=True, type=float, help="± seconds."),
    click.option("--unsolvable-rate", default=0.0, show_default=True, type=float),
    click.option("--error-rate", default=0.0, show_default=True, type=float),
    click.option("--no-bulk", is_flag=True, help="Ignore res.php?ids= like a server without it."),
    click.option("--thread-error", default="ERROR_NO_SLOT_AVAILABLE", show_default=True),
    click.option("--token-ttl", type=float, default=None, help="Token life for every method."),
    click.option(
        "--api-key",
        "api_keys",
        multiple=True,
        help=f"Accepted key (repeatable; default: {SANDBOX_KEY}).",
    ),
    click.option(
        "--seed", type=int, default=None, help="Seed of its randomness (repeatable runs)."
    ),
    click.option(
        "--pingback-method",
        type=click.Choice(["GET", "POST"]),
        default="GET",
        show_default=True,
        help="Callbacks as CaptchaAI (GET) or 2captcha (POST, registered addresses only).",
    ),
    click.option("--pingback-delay", default=0.0, show_default=True, type=float, help="Seconds."),
    click.option("--pingback-drop-rate", default=0.0, show_default=True, type=float),
    click.option(
        "--hang-rate", default=0.0, show_default=True, type=float, help="Requests that hang."
    ),
    click.option(
        "--hang-s", default=60.0, show_default=True, type=float, help="How long they hang."
    ),
    click.option("--status-429-rate", default=0.0, show_default=True, type=float),
    click.option(
        "--retry-after", default=2, show_default=True, type=int, help="429's Retry-After."
    ),
    click.option(
        "--queue-silently",
        is_flag=True,
        help="Beyond the plan, queue captchas instead of an error.",
    ),
    click.option(
        "--balance-captchas",
        type=int,
        default=None,
        help="Captchas accepted before ERROR_ZERO_BALANCE (refill: POST /sandbox/config).",
    ),
    click.option("--outage-s", default=0.0, show_default=True, type=float, help="Outage length."),
    click.option(
        "--outage-in", default=0.0, show_default=True, type=float, help="Seconds until it starts."
    ),
    click.option(
        "--outage-mode",
        type=click.Choice(OUTAGE_MODES),
        default="refuse",
        show_default=True,
        help="Port closed (connections refused), HTTP 503, or requests that hang.",
    ),
]


@click.command("sandbox", help=SANDBOX_HELP)
@option_group(_PROVIDERS_OPTIONS)
@option_group(_CONFIG_OPTIONS)
def sandbox(
    host: str,
    port: int | None,
    provider_specs: tuple[str, ...],
    providers_file: Path | None,
    colliding_ids: bool,
    first_id: int,
    journal_dir: Path | None,
    seed: int | None,
    api_keys: tuple[str, ...],
    token_ttl: float | None,
    no_bulk: bool,
    **fields: Any,
) -> None:
    # The options left in ``fields`` are named as the config fields they set.
    base: dict[str, Any] = {**fields, "bulk": not no_bulk}
    if token_ttl is not None:
        base["token_ttl"] = {method: token_ttl for method in DEFAULT_TOKEN_TTL}
    if api_keys:
        base["api_keys"] = api_keys
    entries = _entries(port, api_keys, provider_specs, providers_file)
    providers = provider_configs(
        base, entries, first_id=first_id, seed=seed, colliding_ids=colliding_ids
    )
    try:
        if journal_dir is not None:
            journal_dir.mkdir(parents=True, exist_ok=True)
        serve(host, providers, journal_dir)
    except OSError as exc:
        raise click.ClickException(exc.strerror or str(exc)) from None


def _entries(
    port: int | None,
    api_keys: Sequence[str],
    provider_specs: Sequence[str],
    providers_file: Path | None,
) -> list[dict[str, Any]]:
    """One dict per provider: its ``port`` and the config fields of its own."""
    if provider_specs and providers_file is not None:
        raise click.UsageError("give --provider or --providers-file, not both")
    if provider_specs:
        if port is not None or api_keys:
            raise click.UsageError("--provider names its own port and key: drop --port/--api-key")
        return [parse_provider(spec) for spec in provider_specs]
    if providers_file is not None:
        if port is not None:
            raise click.UsageError("--providers-file names each port: drop --port")
        return _read_providers_file(providers_file)
    return [{"port": DEFAULT_PORT if port is None else port}]


def parse_provider(spec: str) -> dict[str, Any]:
    """``NAME:PORT:KEY[:THREADS]`` as a provider entry."""
    parts = spec.split(":")
    if len(parts) not in (3, 4) or not all(parts):
        # Never repeat the spec: it holds a key.
        raise click.BadParameter(
            f"expected NAME:PORT:KEY[:THREADS], got {len(parts)} field(s)", param_hint="--provider"
        )
    name, port, key = parts[:3]
    entry: dict[str, Any] = {"name": name, "port": _number(name, "port", port), "api_keys": [key]}
    if len(parts) == 4:
        entry["threads"] = _number(name, "threads", parts[3])
    return entry


def _number(name: str, what: str, text: str) -> int:
    if not text.isdigit():
        raise click.BadParameter(f"provider {name}: {what} must be a number, got {text!r}")
    return int(text)


def _read_providers_file(path: Path) -> list[dict[str, Any]]:
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        hint = "--providers-file"
        raise click.BadParameter(f"{path}: not JSON ({exc})", param_hint=hint) from None
    if not isinstance(entries, list) or not entries:
        raise click.BadParameter(
            f"{path}: expected a non-empty JSON list of providers", param_hint="--providers-file"
        )
    for number, entry in enumerate(entries, start=1):
        where = f"{path}: provider {number}"
        if not isinstance(entry, dict) or "name" not in entry or "port" not in entry:
            raise click.BadParameter(f'{where}: needs "name" and "port"')
        unknown = sorted(set(entry) - _ENTRY_FIELDS)
        if unknown:
            raise click.BadParameter(f"{where}: unknown field(s) {', '.join(unknown)}")
    return entries


def provider_configs(
    base: Mapping[str, Any],
    entries: Sequence[Mapping[str, Any]],
    *,
    first_id: int = FIRST_CAPTCHA_ID,
    seed: int | None = None,
    colliding_ids: bool = False,
) -> dict[int, SandboxConfig]:
    """Each entry's config by port: ``base`` overridden by the entry's own fields.  Provider
    n numbers its captchas from ``first_id + n * PROVIDER_ID_SPAN`` (all from ``first_id``
    when ``colliding_ids``) and, given a seed, uses ``seed + n`` (same tokens from two
    providers would look like a token delivered twice)."""
    configs: dict[int, SandboxConfig] = {}
    names: set[str] = set()
    for number, entry in enumerate(entries):
        fields = {**base, **{k: v for k, v in entry.items() if k != "port"}}
        fields.setdefault(
            "first_id", first_id + (0 if colliding_ids else number * PROVIDER_ID_SPAN)
        )
        if seed is not None:
            fields.setdefault("seed", seed + number)
        name = str(fields.get("name", SandboxConfig.name))
        port = entry["port"]
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise click.BadParameter(f"provider {name}: port must be 1-65535, got {port!r}")
        if port in configs or name in names:
            raise click.BadParameter(f"provider {name}: its name and port must be its own")
        try:
            configs[port] = SandboxConfig(**fields)
        except ValueError as exc:
            raise click.BadParameter(f"provider {name}: {exc}") from None
        names.add(name)
    return configs

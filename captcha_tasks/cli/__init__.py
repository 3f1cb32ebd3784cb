"""The ``captcha-tasks`` command: thin wrappers over the library.

Each sub-command lives in the module that owns its subject and is imported only when it
runs (click's lazy-group pattern): ``captcha-tasks --help`` or ``pool status`` never
import the sandbox, Kafka's helpers or the quickstart.  ``--help`` lists every command
from :data:`COMMANDS` without importing any.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping

import click

from ..errors import CaptchaTasksError

#: Every sub-command: where it lives (``module:attribute``) and its one-line help, which
#: ``--help`` shows without importing it (tests/app/test_cli.py checks each against the
#: command's own).
COMMANDS: dict[str, tuple[str, str]] = {
    "account": (
        "captcha_tasks.cli.solving:account",
        "Print the account's balance and, where the API answers it, its thread usage.",
    ),
    "batch": (
        "captcha_tasks.cli.solving:batch",
        "Solve every row of INPUT (CSV or JSONL), writing each result as it arrives.",
    ),
    "gateway": (
        "captcha_tasks.gateway.cli:gateway",
        "Serve the provider APIs (in.php/res.php, createTask/getTaskResult) to any SDK.",
    ),
    "kafka": ("captcha_tasks.kafka.cli:kafka", "Kafka helpers: consumer lag and topics."),
    "kafka-bridge": (
        "captcha_tasks.kafka.cli:kafka_bridge",
        "Solve the tasks of KAFKA_TASKS_TOPIC through the workers; publish one outcome per "
        "task to KAFKA_RESULTS_TOPIC (failures also to KAFKA_DEAD_LETTER_TOPIC).",
    ),
    "metrics": (
        "captcha_tasks.metrics:metrics_command",
        "Serve Prometheus metrics read from Redis (GET /metrics).",
    ),
    "pingback": ("captcha_tasks.receiver.cli:pingback", "Provider callbacks."),
    "pingback-server": (
        "captcha_tasks.receiver.cli:pingback_server",
        "Receive provider callbacks (CAPTCHAAI_PINGBACK_URL must lead here).",
    ),
    "pool": ("captcha_tasks.cli.pools:pool", "Token pools."),
    "providers": (
        "captcha_tasks.cli.providers:providers",
        "Show each provider's circuit, threads in use, balance and last error.",
    ),
    "quickstart": (
        "captcha_tasks.cli.quickstart:quickstart",
        "Start Redis (if needed), the sandbox (if no API key), a worker and beat; solve a demo.",
    ),
    "sandbox": (
        "captcha_tasks.testing.cli:sandbox",
        "Run a local CaptchaAI-compatible API (for development, tests and benchmarks).",
    ),
    "solve": (
        "captcha_tasks.cli.solving:solve_command",
        "Solve one captcha through the workers and print its token.",
    ),
    "tenants": (
        "captcha_tasks.cli.tenants:tenants",
        "Per tenant: weight, cap, threads in flight and submits parked by lane, budget left.",
    ),
}


def load_command(where: str) -> click.Command:
    """The command object at ``module:attribute``."""
    module, _, attribute = where.partition(":")
    command = getattr(importlib.import_module(module), attribute)
    if not isinstance(command, click.Command):
        raise TypeError(f"{where} is not a click command")
    return command


class LazyGroup(click.Group):
    """A group whose sub-commands are imported when they run (or their help is asked)."""

    def __init__(self, *args: object, lazy: Mapping[str, tuple[str, str]], **kwargs: object):
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = dict(lazy)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            self.add_command(load_command(self.lazy[cmd_name][0]), cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        rows = [(name, self._short_help(name, limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def _short_help(self, name: str, limit: int) -> str:
        if name in self.commands:
            return self.commands[name].get_short_help_str(limit)
        # A stand-in with the same help shortens it exactly as the real command would.
        return click.Command(name, help=self.lazy[name][1]).get_short_help_str(limit)


@click.group(cls=LazyGroup, lazy=COMMANDS)
@click.version_option(package_name="captcha-tasks", prog_name="captcha-tasks")
def cli() -> None:
    """CaptchaAI solving as Celery tasks shared by many workers."""


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

"""Command-line options shared by the commands: :func:`option_group` applies a list of
click options as one decorator, and :func:`limit_options` gives the pingback receiver and
the gateway the same options of a server's :class:`~.limits.Limits` (``--header-timeout``,
``--body-timeout``, ``--max-connections``, ``--max-per-address`` and ``--threads``),
calling the command with one ``limits`` argument in their place."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import click

from .limits import Limits

_DEFAULT = Limits()
_SECONDS = click.FloatRange(min=0, min_open=True)
_COUNT = click.IntRange(min=1)


def option_group(options: Sequence[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """One decorator for click ``options``, listed in the order of a decorator stack (and
    of the command's ``--help``)."""

    def decorate(command: Any) -> Any:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def limit_options(*, header_help: str, threads_help: str) -> Callable[..., Any]:
    """A decorator of a click command that takes ``limits: Limits``: ``header_help`` says
    what ``--header-timeout`` bounds, ``threads_help`` what ``--threads`` do."""
    options = [
        click.option(
            "--header-timeout",
            default=_DEFAULT.header_timeout,
            show_default=True,
            type=_SECONDS,
            help=header_help,
        ),
        click.option(
            "--body-timeout",
            default=_DEFAULT.body_timeout,
            show_default=True,
            type=_SECONDS,
            help="Seconds a client has to send a request's body.",
        ),
        click.option(
            "--max-connections",
            default=_DEFAULT.max_connections,
            show_default=True,
            type=_COUNT,
            help="Open connections in all (within the open-files limit).",
        ),
        click.option(
            "--max-per-address",
            default=_DEFAULT.max_per_address,
            show_default=True,
            type=_COUNT,
            help="Open connections from one address (trusted proxies excepted).",
        ),
        click.option(
            "--threads",
            "judge_threads",
            default=_DEFAULT.judge_threads,
            show_default=True,
            type=_COUNT,
            help=threads_help,
        ),
    ]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def with_limits(**kwargs: Any) -> Any:
            fields = {name: kwargs.pop(name) for name in _FIELDS}
            return command(limits=Limits(**fields), **kwargs)

        decorated: Callable[..., Any] = option_group(options)(with_limits)
        return decorated

    return decorate


_FIELDS = ("header_timeout", "body_timeout", "max_connections", "max_per_address", "judge_threads")

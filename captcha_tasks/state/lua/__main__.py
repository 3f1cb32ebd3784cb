"""``python -m captcha_tasks.state.lua``: the SHA1 and name of every script, one a line, as
``EVALSHA`` names them (another client that assembles the same files, a Node.js package
say, compares its own against these); ``--source NAME`` prints one script as Redis runs it."""

from __future__ import annotations

import click

from . import LIBRARY


@click.command()
@click.option("--source", "name", metavar="NAME", help="Print this script's assembled source.")
def main(name: str | None) -> None:
    """Print every script's SHA1 and name (or one script's assembled source)."""
    if name is not None:
        if name not in LIBRARY.names():
            raise click.BadParameter(f"no script named {name!r}", param_hint="--source")
        click.echo(LIBRARY.source(name), nl=False)
        return
    for script in LIBRARY.names():
        click.echo(f"{LIBRARY.script(script).sha}  {script}")


if __name__ == "__main__":
    main()

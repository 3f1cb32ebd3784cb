"""``celery -A captcha_tasks worker|beat ...`` for the suite's own processes, without the
``celery`` command group: ``python harness/celery_main.py worker -P threads ...`` (what
:class:`captcha_tasks.testing.processes.CeleryProcess` runs in this suite: tests/conftest.py
sets its ``CELERY_COMMAND``).

The group's module imports every subcommand and every plugin's (Flower with Tornado,
click-repl with prompt_toolkit): about a CPU-second in each of the ~200 worker and beat
processes a full run starts (a worker's start took ~2.1 CPU-s through ``celery``, ~1.6
through this).  This runs the same click command (``celery.bin.worker`` or
``celery.bin.beat``) on the same app object with the same arguments, as the group would
after ``-A captcha_tasks`` (the app has no user options, which the group would add).  The
tests of the command line itself (``tests/worker/test_startup.py``, the quickstart, the
README steps, the packaging and compose tests) run the real ``celery``.
"""

from __future__ import annotations

import sys

# Celery's command module builds a pygments lexer at import when pygments is installed (it
# is, beside pytest), compiling its regular expressions in every process, to colour the
# tracebacks of a failed command: ~0.2 CPU-s, none of it needed by a worker whose log is a
# file.  Absent, Celery uses its plain fallback.
sys.modules.setdefault("pygments", None)  # type: ignore[arg-type]

from celery.bin.base import CLIContext  # noqa: E402


def main(argv: list[str]) -> int:
    from captcha_tasks.worker.app import app

    role, *args = argv
    if role == "worker":
        from celery.bin.worker import worker as command
    elif role == "beat":
        from celery.bin.beat import beat as command
    else:
        raise SystemExit(f"harness.celery_main: worker or beat, not {role!r}")
    assert not any(app.user_options.values()), "the celery group would add these options"
    context = CLIContext(app=app, no_color=None, workdir=None, quiet=False)
    return int(command.main(args=args, prog_name=f"celery {role}", obj=context) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

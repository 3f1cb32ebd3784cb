"""Python packages the test suite runs but must not install: each in a virtual environment
of its own, built once by pip and cached.

``capmonstercloudclient`` pins aiohttp, pydantic, typing-extensions, attrs and idna to
exact versions; in the project's ``.venv`` (or a ``test`` extra) it would fight every
other package for them.  ``isolated_python(requirement, log)`` creates
``~/.cache/captcha-tasks/venvs/<name>-<version>-py<X.Y>/`` (``$XDG_CACHE_HOME``
respected) with only that requirement installed, and returns its interpreter; a test runs
a driver script there as a subprocess.  A file lock keeps parallel pytest workers from
building the same environment twice; the ``.complete`` marker is written last, so a build
that died half-way is started again.  Like ``tests/npm_cache.py`` for npm.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from harness.kafka_broker import cache_root

#: CapMonster Cloud's official SDK, at the version the gateway's tests were written for.
CAPMONSTER = "capmonstercloudclient==4.3.1"
PIP_TIMEOUT_S = 300


def venv_dir(requirement: str, cache: Path | None = None) -> Path:
    """Where ``requirement``'s environment lives: one per pinned version and Python."""
    name = requirement.replace("==", "-").replace("/", "_")
    python = f"py{sys.version_info.major}.{sys.version_info.minor}"
    return (cache or cache_root().parent / "venvs") / f"{name}-{python}"


def isolated_python(requirement: str, log: Path, cache: Path | None = None) -> Path:
    """The interpreter of a virtual environment holding ``requirement`` alone (an exact
    ``name==version``), built on first use; :class:`RuntimeError` (pip's output tail)
    when it cannot be built."""
    if "==" not in requirement:
        raise ValueError(f"pin an exact version: {requirement!r}")
    target = venv_dir(requirement, cache)
    python = target / "bin" / "python"
    if (target / ".complete").exists():
        return python
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker building it: wait for its end
        if not (target / ".complete").exists():
            shutil.rmtree(target, ignore_errors=True)  # a build that died half-way
            venv.EnvBuilder(with_pip=True, clear=True).create(target)
            _pip_install(python, requirement, log)
            (target / ".complete").write_text(requirement + "\n")
    return python


def _pip_install(python: Path, requirement: str, log: Path) -> None:
    argv = [str(python), "-m", "pip", "install", "--disable-pip-version-check", requirement]
    with open(log, "ab") as out:
        done = subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT, timeout=PIP_TIMEOUT_S, check=False
        )
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"pip install {requirement} failed (exit {done.returncode}):\n{tail}")

"""Node.js packages for the tests: is Node 18+ here, and a package's locked dependencies
installed once by ``npm ci`` and cached.

``node_modules(package, log)`` installs from the package's committed
``package-lock.json`` into ``~/.cache/captcha-tasks/node/<lockfile digest>/``
(``$XDG_CACHE_HOME`` respected); the package then runs with ``NODE_PATH`` pointing there,
so the source tree stays clean.  Used for the Kafka example (``examples/node``) and the
Node.js client (``clients/node``).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from harness.kafka_broker import cache_root

MIN_NODE = 18
NPM_TIMEOUT_S = 300


def missing_node() -> str | None:
    """Why Node.js packages cannot run here (no node 18+, no npm), or None."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None:
        return f"no `node` on PATH (Node {MIN_NODE}+ is needed)"
    if npm is None:
        return "no `npm` on PATH (it installs the packages' locked dependencies)"
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30)
    match = re.match(r"v(\d+)", out.stdout.strip())
    if match is None or int(match.group(1)) < MIN_NODE:
        return f"`node` is {out.stdout.strip() or 'unknown'}; Node {MIN_NODE}+ is needed"
    return None


def node_modules(package: Path, log: Path, cache: Path | None = None) -> Path:
    """``package``'s ``node_modules``, installed by ``npm ci`` on first use and cached."""
    lock = package / "package-lock.json"
    digest = hashlib.sha256(lock.read_bytes() + (package / "package.json").read_bytes())
    target = (cache or cache_root().parent / "node") / digest.hexdigest()[:16]
    if (target / ".complete").exists():
        return target / "node_modules"
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        for name in ("package.json", "package-lock.json"):
            shutil.copy2(package / name, staging / name)
        _npm_ci(staging, log)
        (staging / ".complete").touch()
        try:
            staging.rename(target)
        except OSError:
            if not (target / ".complete").exists():  # another run finished first: use its copy
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target / "node_modules"


def _npm_ci(folder: Path, log: Path) -> None:
    argv = [shutil.which("npm") or "npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"]
    with open(log, "ab") as out:
        done = subprocess.run(
            argv, cwd=folder, stdout=out, stderr=subprocess.STDOUT, timeout=NPM_TIMEOUT_S
        )
    if done.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"npm ci failed (exit {done.returncode}):\n{tail}")

"""The Node.js example client (``examples/node``) for the Kafka tests: its ``npm ci`` is
run once per lockfile and cached, like the Kafka broker's jars.

``node_modules()`` installs from the committed ``package-lock.json`` into
``~/.cache/captcha-tasks/node/<lockfile digest>/`` (``$XDG_CACHE_HOME`` respected); the
example then runs with ``NODE_PATH`` pointing there, so the source tree stays clean.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from captcha_tasks.dev.kafka_broker import cache_root

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node"
MIN_NODE = 18
NPM_TIMEOUT_S = 300


def missing_node() -> str | None:
    """Why the Node example cannot run here (no node 18+, no npm), or None."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None:
        return "no `node` on PATH (the Node.js client example needs Node 18+)"
    if npm is None:
        return "no `npm` on PATH (it installs the example's locked dependencies)"
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30)
    match = re.match(r"v(\d+)", out.stdout.strip())
    if match is None or int(match.group(1)) < MIN_NODE:
        return f"`node` is {out.stdout.strip() or 'unknown'}; the example needs {MIN_NODE}+"
    return None


def node_modules(log: Path, cache: Path | None = None) -> Path:
    """The example's ``node_modules``, installed by ``npm ci`` on first use and cached."""
    lock = EXAMPLE / "package-lock.json"
    digest = hashlib.sha256(lock.read_bytes() + (EXAMPLE / "package.json").read_bytes())
    target = (cache or cache_root().parent / "node") / digest.hexdigest()[:16]
    if (target / ".complete").exists():
        return target / "node_modules"
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        for name in ("package.json", "package-lock.json"):
            shutil.copy2(EXAMPLE / name, staging / name)
        argv = [shutil.which("npm") or "npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"]
        with open(log, "ab") as out:
            done = subprocess.run(
                argv, cwd=staging, stdout=out, stderr=subprocess.STDOUT, timeout=NPM_TIMEOUT_S
            )
        if done.returncode != 0:
            tail = log.read_text()[-3000:]
            raise RuntimeError(f"npm ci failed (exit {done.returncode}):\n{tail}")
        (staging / ".complete").touch()
        try:
            staging.rename(target)
        except OSError:
            if not (target / ".complete").exists():  # another run finished first: use its copy
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target / "node_modules"

"""The Node.js example client (``examples/node``) for the Kafka tests: its ``npm ci`` is
run once per lockfile and cached (``tests/npm_cache.py``), like the Kafka broker's jars."""

from __future__ import annotations

from pathlib import Path

import npm_cache
from npm_cache import missing_node

__all__ = ["EXAMPLE", "missing_node", "node_modules"]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node"


def node_modules(log: Path, cache: Path | None = None) -> Path:
    """The example's ``node_modules``, installed by ``npm ci`` on first use and cached."""
    return npm_cache.node_modules(EXAMPLE, log, cache)

"""The JSON Schemas (2020-12) of captcha-tasks' plain-JSON contract, shipped in the wheel.

The solve request, the outcome, a batch stream entry and the four Kafka messages; the
files refer to each other by their ``$id`` (``urn:captcha-tasks:...``).  Clients in other
languages read the same files (``captcha_tasks/schemas/*.schema.json``).
"""

from __future__ import annotations

import json
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

_SUFFIX = ".schema.json"


def names() -> list[str]:
    """The schemas' names, sorted: ``outcome``, ``kafka-task``, ..."""
    return sorted(p.name.removesuffix(_SUFFIX) for p in _folder().iterdir() if _is_schema(p))


def load(name: str) -> dict[str, Any]:
    """The schema ``name`` (one of :func:`names`) as a dict."""
    path = _folder() / f"{name}{_SUFFIX}"
    if not path.is_file():
        raise KeyError(f"no schema named {name!r}; the schemas are {', '.join(names())}")
    return dict(json.loads(path.read_text(encoding="utf-8")))


def _folder() -> Traversable:
    return files(__name__)


def _is_schema(path: Traversable) -> bool:
    return path.is_file() and path.name.endswith(_SUFFIX)

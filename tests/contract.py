"""The JSON Schema files of ``schemas/``, loaded for tests (``validate("outcome", data)``)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"


def load(name: str) -> dict[str, Any]:
    return dict(json.loads((SCHEMAS / f"{name}.schema.json").read_text()))


@cache
def registry() -> Registry:
    """Every schema file under its ``$id``, so they can refer to each other."""
    resources = []
    for path in sorted(SCHEMAS.glob("*.schema.json")):
        schema = json.loads(path.read_text())
        resources.append((schema["$id"], Resource.from_contents(schema)))
    return Registry().with_resources(resources)


@cache
def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(
        load(name), registry=registry(), format_checker=Draft202012Validator.FORMAT_CHECKER
    )


def problems(name: str, data: Any) -> list[str]:
    """Why ``data`` does not match schema ``name`` (empty when it does)."""
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator(name).iter_errors(data)
    ]


def validate(name: str, data: Any) -> None:
    found = problems(name, data)
    assert not found, f"{name}: {found} in {data!r}"

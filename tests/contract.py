"""The JSON Schema files of ``captcha_tasks/schemas/``, loaded for tests
(``validate("outcome", data)``)."""

from __future__ import annotations

from functools import cache
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from captcha_tasks.schemas import load, names


@cache
def registry() -> Registry:
    """Every schema file under its ``$id``, so they can refer to each other."""
    resources = []
    for name in names():
        schema = load(name)
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

"""One Celery boundary: only ``captcha_tasks/worker/celery_compat/`` imports Celery's or
kombu's internals; everything else uses their public API.  Nothing reads or edits a task
request's ``chain`` (what runs after a solve travels in its own message)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from parsing import parse

PACKAGE = Path(__file__).resolve().parents[2] / "captcha_tasks"
BOUNDARY = PACKAGE / "worker" / "celery_compat"
#: The modules of Celery's and kombu's public API the package may import anywhere.
PUBLIC = {
    "celery",
    "celery.bootsteps",
    "celery.canvas",
    "celery.exceptions",
    "celery.result",
    "celery.schedules",
    "celery.signals",
    "celery.states",
    "kombu",
    "kombu.exceptions",
}

pytestmark = pytest.mark.unit


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names} & _SUBMODULES
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {name for name in found if name.split(".")[0] in ("celery", "kombu")}


#: ``from celery import bootsteps`` names a module, not an attribute of ``celery``.
_SUBMODULES = {"celery.bootsteps", "celery.states", "celery.signals", "celery.app"}


def test_only_the_boundary_imports_celery_internals() -> None:
    outside = {
        str(path.relative_to(PACKAGE)): sorted(_imported(path) - PUBLIC)
        for path in _modules()
        if BOUNDARY not in path.parents
    }
    assert {where: names for where, names in outside.items() if names} == {}
    # the boundary does import them (the test would pass on an empty boundary otherwise)
    inside = set().union(*(_imported(p) for p in BOUNDARY.rglob("*.py")))
    assert {"celery.worker.request", "celery.app.task", "kombu.transport"} <= inside


#: Attributes of Celery's internals the boundary uses: never outside it.
INTERNAL_USES = re.compile(
    r"\.amqp\b|event_dispatcher|_request_dict|\bContext\(|mark_as_(done|failure|revoked)"
    r"|get_key_for_task|encode_result|decode_result|get_task_meta|call_repeatedly"
)


def test_only_the_boundary_uses_celery_internals() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in _modules()
        if BOUNDARY not in path.parents
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if INTERNAL_USES.search(line)
    ]
    assert found == []


def test_every_internal_use_names_the_behaviour_it_depends_on() -> None:
    for path in sorted(BOUNDARY.glob("*.py")):
        if path.name == "__init__.py":
            continue
        text = path.read_text(encoding="utf-8")
        assert re.search(r"# (Celery|kombu):", text), path.name


def test_nothing_reads_or_edits_a_requests_chain() -> None:
    pattern = re.compile(r"request\.chain\b|request,\s*[\"']chain[\"']")
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in _modules()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []

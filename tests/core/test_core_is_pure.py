"""The core (``captcha_tasks/core/``) does no I/O.  import-linter holds it away from the
package's I/O modules and from Celery, kombu, redis and the HTTP libraries
(``pyproject.toml``), but it cannot see the standard library: this test holds the core to
an allowlist of standard modules that compute, and nothing that talks to a socket, a file,
a process or a thread."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from parsing import parse

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "captcha_tasks" / "core"

#: Standard modules the core may import: they compute, they do no I/O (``logging`` says
#: what a decision was, through whatever handler the process installed).
ALLOWED = {
    "__future__",
    "bisect",
    "collections",
    "dataclasses",
    "datetime",
    "enum",
    "hashlib",
    "hmac",
    "ipaddress",
    "json",
    "logging",
    "math",
    "random",
    "re",
    "typing",
    "urllib.parse",
}


def outside_imports(source: str) -> set[str]:
    """The modules ``source`` imports that are neither relative (the package) nor allowed."""
    found = set()
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found |= {
            n for n in names if n not in ALLOWED and n.split(".")[0] not in ALLOWED - {"urllib"}
        }
    return found


def test_the_core_imports_only_standard_modules_that_compute() -> None:
    files = sorted(CORE.glob("*.py"))
    assert len(files) > 10, files
    found = {p.name: outside_imports(p.read_text(encoding="utf-8")) for p in files}
    assert {name: mods for name, mods in found.items() if mods} == {}


def test_the_check_sees_io_and_absolute_imports_of_the_package() -> None:
    assert outside_imports("import socket\nfrom urllib.request import urlopen\n") == {
        "socket",
        "urllib.request",
    }
    assert outside_imports("from urllib.parse import urlsplit\nimport json\n") == set()
    # the package itself only relatively (import-linter checks which of its modules)
    assert outside_imports("from captcha_tasks.state import State\n") == {"captcha_tasks.state"}
    assert outside_imports("from ..state import State\n") == set()

"""Pins the public API (listed in captcha_tasks.public and the package's ``__all__``)
against literal copies: a removal or rename here is a breaking change."""

from __future__ import annotations
import __future__

import ast
import importlib
import inspect
import re
import sys
import types
from pathlib import Path

import pytest
from celery import Celery, Task
from parsing import parse

import captcha_tasks
from captcha_tasks import public

ROOT = Path(__file__).resolve().parents[2]

#: ``from captcha_tasks import <name>``.
EXPORTED = {
    "METHODS",
    "NOT_READY",
    "CaptchaAIClient",
    "CaptchaTasksError",
    "Failed",
    "Settings",
    "SolveRequest",
    "Solved",
    "ValidationError",
    "app",
    "build_request",
    "create_pool",
    "errors",
    "get_settings",
    "outcome_from_dict",
    "poll",
    "report",
    "solve",
    "stream",
    "submit",
    "take_token",
}

#: Import paths from deeper modules that the documentation tells users to use.
DOCUMENTED = {
    "captcha_tasks.batch.stream",
    "captcha_tasks.aio.solve",
    "captcha_tasks.aio.stream",
    "captcha_tasks.aio.aclose",
    "captcha_tasks.aio.report",
    "captcha_tasks.errors.FatalError",
    "captcha_tasks.toolkit.sessions.CookieStore",
    "captcha_tasks.toolkit.sessions.SessionLock",
    "captcha_tasks.toolkit.sessions.reauthenticate",
    "captcha_tasks.toolkit.sessions.try_reauthenticate",
    "captcha_tasks.toolkit.proxies.ProxyPool",
    "captcha_tasks.state.State",
    "captcha_tasks.kafka.client.TaskProducer",
    "captcha_tasks.kafka.client.enqueue",
    "captcha_tasks.receiver.default_receiver",
    "captcha_tasks.receiver.MAX_BODY",
    "captcha_tasks.schemas.load",
    "captcha_tasks.testing.sandbox.SandboxServer",
    "captcha_tasks.testing.sandbox.SandboxConfig",
    "captcha_tasks.testing.processes.SandboxProcess",
    "captcha_tasks.testing.processes.RedisServer",
}

#: Paths of 0.1.0 that 0.2.0 removed, and what to use instead.
REMOVED = {
    "captcha_tasks.sessions": "captcha_tasks.toolkit.sessions",
    "captcha_tasks.state.sessions": "captcha_tasks.toolkit.sessions",
    "captcha_tasks.state.proxies.ProxyPool": "captcha_tasks.toolkit.proxies.ProxyPool",
    "captcha_tasks.store": "captcha_tasks.state.State",
    "captcha_tasks.store.redis_client": "captcha_tasks.state.State.build(app.settings()).redis",
    "captcha_tasks.store.keys": "captcha_tasks.state.keys.Keys(app.settings().redis.key_prefix)",
    "captcha_tasks.store.proxies": "captcha_tasks.toolkit.proxies.ProxyPool.from_settings()",
    "captcha_tasks.dev.devstack.SandboxProcess": "captcha_tasks.testing.processes.SandboxProcess",
    "captcha_tasks.dev.sandbox": "captcha_tasks.testing.sandbox",
    "captcha_tasks.client": "captcha_tasks.providers.inphp",
    "captcha_tasks.jsonclient": "captcha_tasks.providers.jsonapi",
    "captcha_tasks.connections": "captcha_tasks.state.connections",
    "captcha_tasks.keys": "captcha_tasks.state.keys",
    "captcha_tasks.redact": "captcha_tasks.worker.redact",
    "captcha_tasks.stream.stream": "captcha_tasks.batch.stream",
}


@pytest.mark.unit
def test_the_public_list_is_what_is_pinned() -> None:
    assert set(public.DOCUMENTED) == DOCUMENTED
    assert all(what.strip() for what in public.DOCUMENTED.values())
    assert public.REMOVED == REMOVED
    assert public.paths() == [f"captcha_tasks.{n}" for n in captcha_tasks.__all__] + list(
        public.DOCUMENTED
    )


@pytest.mark.unit
def test_exported_members() -> None:
    assert set(captcha_tasks.__all__) == EXPORTED
    # Nothing public beyond __all__ (subpackages are reachable, but are not names of it).
    public = {
        name
        for name, value in vars(captcha_tasks).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType | __future__._Feature)
    }
    assert public <= EXPORTED, public - EXPORTED


@pytest.mark.unit
def test_each_export_is_what_it_says() -> None:
    assert isinstance(captcha_tasks.app, Celery) and captcha_tasks.app.main == "captcha_tasks"
    for name in ("solve", "submit", "poll"):
        task = getattr(captcha_tasks, name)
        assert isinstance(task, Task) and task.name == f"captcha_tasks.{name}"
    for name in ("report", "create_pool", "take_token", "stream", "build_request"):
        assert inspect.isfunction(getattr(captcha_tasks, name)), name
    assert issubclass(captcha_tasks.ValidationError, captcha_tasks.CaptchaTasksError)
    assert captcha_tasks.errors.CaptchaTasksError is captcha_tasks.CaptchaTasksError
    assert "turnstile" in captcha_tasks.METHODS


@pytest.mark.unit
def test_documented_import_paths() -> None:
    for path in DOCUMENTED:
        module, _, name = path.rpartition(".")
        assert hasattr(importlib.import_module(module), name), path
    assert captcha_tasks.stream is importlib.import_module("captcha_tasks.batch").stream


@pytest.mark.unit
def test_stream_is_the_function_alone() -> None:
    """One name, one meaning: the batch module is ``captcha_tasks.batch``, and the package is
    a plain module (no class swapped in to reconcile a module with a function)."""
    import captcha_tasks.batch

    assert captcha_tasks.stream is captcha_tasks.batch.stream
    assert inspect.isfunction(captcha_tasks.stream)
    assert type(captcha_tasks) is types.ModuleType
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("captcha_tasks.stream")


def _resolve(path: str) -> object:
    """The object at import path ``path``: a module, or a name inside one."""
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError:
        module, _, name = path.rpartition(".")
        return getattr(_resolve(module), name)


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def _imported_paths(code: str) -> set[str]:
    found = set()
    for node in ast.walk(parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("captcha_tasks"):
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("captcha_tasks.")}
    return found


def _public(path: str) -> bool:
    """Listed; a name of a listed module (``captcha_tasks.errors.ProxyError``); or a module
    with listed names in it (``from captcha_tasks import aio``)."""
    listed = set(public.paths())
    if path in listed or any(p.startswith(path + ".") for p in listed):
        return True
    parent = path.rpartition(".")[0]
    # `captcha_tasks.errors` is the module; `captcha_tasks.stream` is a function
    module, _, name = parent.rpartition(".")
    return parent in listed and isinstance(
        getattr(importlib.import_module(module), name, None), types.ModuleType
    )


@pytest.mark.unit
def test_the_docs_import_only_public_paths() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    used = {
        path: page.name
        for page in pages
        for code in _code_blocks(page.read_text(encoding="utf-8"))
        if not code.lstrip().startswith("--8<--")  # a file of examples/, tested with its app
        for path in _imported_paths(_loose(code))
    }
    assert used, "no imports found in the documentation's code blocks"
    assert {p: where for p, where in used.items() if not _public(p)} == {}


def _loose(code: str) -> str:
    # Blocks are fragments (top-level await, a view's return): only their imports matter.
    return "\n".join(line for line in code.splitlines() if line.startswith(("from ", "import ")))


@pytest.mark.unit
def test_task_names() -> None:
    captcha_tasks.app.loader.import_default_modules()  # what a worker registers
    names = {t for t in captcha_tasks.app.tasks if t.startswith("captcha_tasks.")}
    assert names == {
        "captcha_tasks.gateway_callback",
        "captcha_tasks.solve",
        "captcha_tasks.submit",
        "captcha_tasks.poll",
        "captcha_tasks.prewarm",
        "captcha_tasks.report",
        "captcha_tasks.check_threads",
        "captcha_tasks.probe",
    }


@pytest.mark.unit
@pytest.mark.parametrize("old", sorted(REMOVED))
def test_removed_paths_are_gone(old: str) -> None:
    sys.modules.pop(old, None)
    with pytest.raises((ImportError, AttributeError)):
        _resolve(old)
    # what the docs say to use instead is there
    assert _module_of(REMOVED[old])


def _module_of(path: str) -> str:
    """The longest importable module at the start of ``path``."""
    parts = path.split("(")[0].split(".")
    for end in range(len(parts), 0, -1):
        try:
            importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError:
            continue
        return ".".join(parts[:end])
    raise AssertionError(path)


@pytest.mark.unit
def test_every_error_class_says_what_to_do_and_every_code_has_a_class() -> None:
    from captcha_tasks import errors

    codes = errors.codes()
    for cls in set(codes.values()):
        assert cls.__doc__ and cls.__doc__.strip(), cls.__name__
        assert cls.__module__ == "captcha_tasks.errors", cls.__name__
    assert codes["ERROR_WRONG_USER_KEY"] is errors.AuthError
    assert codes["ERROR_SOLVE_TIMEOUT"] is errors.SolveTimeout
    assert codes["ERROR_CAPTCHA_TASKS"] is errors.CaptchaTasksError


def _package_of(path: Path) -> list[str]:
    """The package a relative import in the file at ``path`` starts from."""
    return list(path.relative_to(ROOT).parts[:-1])


def _imports_a_lazy_submodule(path: Path) -> bool:
    """Whether the module takes a lazily loaded submodule of the package (``from . import
    errors``) through the package's ``__getattr__``."""
    lazy = {name for name, (_, attr) in captcha_tasks._SOURCES.items() if attr is None}
    package = _package_of(path)
    for node in ast.walk(parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level and node.module is None:
            target = package[: len(package) - node.level + 1]
            if target == ["captcha_tasks"] and lazy & {a.name for a in node.names}:
                return True
    return False


@pytest.mark.unit
def test_a_module_that_takes_a_lazy_submodule_imports_first_in_a_fresh_process() -> None:
    """``import captcha_tasks.core.batching`` first thing in a process loaded the whole package
    from inside it, and failed on the circle."""
    import subprocess

    paths = sorted((ROOT / "captcha_tasks").rglob("*.py"))
    modules = [
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in paths
        if _imports_a_lazy_submodule(p)
    ]
    assert "captcha_tasks.core.batching" in modules and len(modules) > 5, modules
    # One fresh process imports the third-party packages (never ours), then forks a child
    # per module that imports it first thing: the package's own import order is what is
    # tested, at a fork's cost instead of an interpreter start and celery's import each.
    code = (
        "import importlib, os, sys, traceback\n"
        "import celery, kombu, redis, requests\n"
        "assert not [m for m in sys.modules if m.startswith('captcha_tasks')]\n"
        "failed = []\n"
        "for module in sys.argv[1:]:\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        try:\n"
        "            importlib.import_module(module)\n"
        "        except BaseException:\n"
        "            traceback.print_exc()\n"
        "            os._exit(1)\n"
        "        os._exit(0)\n"
        "    if os.waitpid(pid, 0)[1]:\n"
        "        failed.append(module)\n"
        "print(' '.join(failed))\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", code, *modules],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and not done.stdout.strip(), (done.stdout, done.stderr[-3000:])

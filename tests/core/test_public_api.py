"""Pins the public API: a removal or rename here is a breaking change."""

from __future__ import annotations
import __future__

import importlib
import inspect
import sys
import types

import pytest
from celery import Celery, Task
from public_api import DOCUMENTED, EXPORTED

import captcha_tasks


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


def test_documented_import_paths() -> None:
    for path in DOCUMENTED:
        module, _, name = path.rpartition(".")
        assert hasattr(importlib.import_module(module), name), path
    assert captcha_tasks.stream is importlib.import_module("captcha_tasks.stream").stream


def test_task_names() -> None:
    names = {t for t in captcha_tasks.app.tasks if t.startswith("captcha_tasks.")}
    assert names == {
        "captcha_tasks.solve",
        "captcha_tasks.submit",
        "captcha_tasks.poll",
        "captcha_tasks.prewarm",
        "captcha_tasks.report",
        "captcha_tasks.check_threads",
        "captcha_tasks.probe",
    }


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [
        ("captcha_tasks.sessions", "CookieStore", "captcha_tasks.toolkit.sessions"),
        ("captcha_tasks.state.sessions", "reauthenticate", "captcha_tasks.toolkit.sessions"),
    ],
)
def test_moved_modules_keep_their_old_path_with_a_warning(old: str, name: str, new: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)


def test_moved_names_keep_their_old_path_with_a_warning() -> None:
    from captcha_tasks.state import proxies
    from captcha_tasks.toolkit.proxies import ProxyPool

    with pytest.warns(DeprecationWarning, match="captcha_tasks.toolkit.proxies"):
        assert proxies.ProxyPool is ProxyPool
    with pytest.warns(DeprecationWarning, match="captcha_tasks.store is deprecated"):
        store = captcha_tasks.store
    with pytest.warns(DeprecationWarning, match="store.keys"):
        assert store.keys().prefix == captcha_tasks.get_settings().key_prefix


def test_every_error_class_says_what_to_do_and_every_code_has_a_class() -> None:
    from captcha_tasks import errors

    codes = errors.codes()
    for cls in set(codes.values()):
        assert cls.__doc__ and cls.__doc__.strip(), cls.__name__
        assert cls.__module__ == "captcha_tasks.errors", cls.__name__
    assert codes["ERROR_WRONG_USER_KEY"] is errors.AuthError
    assert codes["ERROR_SOLVE_TIMEOUT"] is errors.SolveTimeout
    assert codes["ERROR_CAPTCHA_TASKS"] is errors.CaptchaTasksError

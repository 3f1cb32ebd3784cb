"""Write the bytecode of what the suite's processes import, once, before they start.

The test scripts let Python write bytecode (``PYTHONDONTWRITEBYTECODE`` unset) instead of
compiling whole virtual environments at install; but six test processes starting at
once would each compile Celery, kombu, redis-py and the rest before any of them had
written it.  This imports every module of the package (and Celery's command line, and
the test runner) in one process first.  Nothing runs: ``__main__`` modules are skipped, and
a module whose optional dependency is missing is left out.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil

import captcha_tasks


def main() -> None:
    prefix = f"{captcha_tasks.__name__}."
    for module in pkgutil.walk_packages(captcha_tasks.__path__, prefix, onerror=lambda _: None):
        if module.name.endswith(".__main__"):
            continue
        with contextlib.suppress(ImportError):  # an optional extra not installed here
            importlib.import_module(module.name)
    for name in ("celery.bin.celery", "pytest", "xdist"):
        importlib.import_module(name)


if __name__ == "__main__":
    main()

"""Every Celery setting of captcha-tasks.

They live in :mod:`captcha_tasks.worker.config`, which the package's own app loads by its
full name, so a ``celeryconfig`` module of the host project (a Django project with one at
its root, say) can never replace them.  This module re-exports them for tools that load
Celery settings by this name (``celery --config celeryconfig``).
"""

from captcha_tasks.worker.config import *  # noqa: F403

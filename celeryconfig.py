"""Every Celery setting of captcha-tasks, for tools that load Celery settings by this name
(``celery --config celeryconfig``).

They are built by :func:`captcha_tasks.worker.config.celery_config` from the settings of
this process's environment; the package's own app builds them itself, so a
``celeryconfig`` module of the host project (a Django project with one at its root, say)
can never replace them.
"""

from captcha_tasks.settings import get_settings
from captcha_tasks.worker.config import celery_config

globals().update(celery_config(get_settings()))

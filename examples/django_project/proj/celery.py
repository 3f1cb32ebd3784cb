"""The project's own Celery app (Celery's "First steps with Django").

It runs the project's tasks (``@shared_task`` in each app's ``tasks.py``) on its own queue,
``django``.  captcha-tasks keeps its own Celery app and ``celeryconfig``: ``solve.delay``
always goes through that one, and its tasks are not registered here.  Both use one Redis.

Workers, side by side::

    celery -A captcha_tasks worker -P threads -c 32 -l INFO     # captcha.* queues
    celery -A proj worker -Q django -l INFO                      # this project's tasks
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
# Every CELERY_* Django setting configures this app (and only this app).
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Celery's Django guide: load the project's Celery app whenever Django starts, so that
# @shared_task uses it.
from .celery import app as celery_app

__all__ = ("celery_app",)

"""This app's own tasks: they run on this app's worker, from its own queue."""

from __future__ import annotations

from celery import shared_task


@shared_task(ignore_result=False)
def add_together(a: int, b: int) -> int:
    """The example task of Flask's Celery guide."""
    return a + b

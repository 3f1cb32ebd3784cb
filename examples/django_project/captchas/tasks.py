"""The project's own tasks: they run on the project's worker, from its own queue."""

from celery import shared_task


@shared_task
def add(x: int, y: int) -> int:
    """The example task of Celery's Django guide."""
    return x + y

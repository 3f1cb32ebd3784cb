"""The Celery boundary: the one place that touches Celery's and kombu's internals.

Everything else in the package uses public Celery API only (``app.task``, signals,
canvas signatures, ``AsyncResult``, ``send_task``, bootsteps); ``tests/core/
test_celery_boundary.py`` holds it to that.  Each use here carries a comment naming the
Celery (or kombu) behaviour it depends on (``# Celery:`` / ``# kombu:``), and the e2e
modules in ``scripts/test-lowest``'s ``BOUNDARY`` list run it on both the lowest and the
newest Celery the package allows.

* :mod:`.messages`: what a solve message is to the worker: its ``Request`` subclass (no
  ``task-succeeded`` event at the message's end), :func:`~.messages.hand_over` (no result
  stored at the task's return), the retry that never drops a message, task events sent by
  hand, ``Control.revoke`` remembered in Redis, housekeeping on the worker's timer.
* :mod:`.records`: the result record written by hand in the backend's format, read back as
  the backend reads it, and what runs after a solve (its follow-ups: carried in the
  solve's own message, run with the outcome through the backend's ``mark_as_*`` with a
  request ``Context``).
* :mod:`.backend`: the Redis result backend whose ``get()`` waits out an outage.
* :mod:`.transport`: kombu's Redis transports with the released-connection fault closed,
  the Sentinel result backend on master-following connections, and the lists kombu keeps
  a queue's messages in (one per priority).

The submodules are imported by what uses them (this package's ``__init__`` imports none):
``captcha-tasks metrics`` reads kombu's queue names without loading a worker's Celery.
"""

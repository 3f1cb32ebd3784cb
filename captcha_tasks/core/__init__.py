"""The core: every decision captcha-tasks makes, as plain values and functions, no I/O.

Nothing here talks to Redis, Celery, the network or a clock: each function takes what
happened (the job, what the API or Redis said, the time) and returns what to do next as a
value, and the edges (:mod:`captcha_tasks.worker`, :mod:`captcha_tasks.state`, the batch
drivers) carry it out.  The core imports nothing of the package but :mod:`~captcha_tasks.errors`,
:mod:`~captcha_tasks.state.keys`, :mod:`~captcha_tasks.methods` and its own modules; import-linter
holds it to that (``pyproject.toml``).  docs/reference/internals.md maps its modules.
"""

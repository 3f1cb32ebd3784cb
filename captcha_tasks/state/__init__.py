"""Shared state in Redis: everything many workers on many hosts must agree on.

Redis only: nothing here imports Celery or the tasks.  Each module owns one kind of state
behind a small class, with one Lua script per atomic operation (:mod:`.lua` registers
them).  :mod:`.store` holds the per-process handles.
"""

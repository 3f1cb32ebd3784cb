"""Deprecated: moved to :mod:`captcha_tasks.toolkit.sessions` (removed in the next release)."""

from __future__ import annotations

import warnings

from ..toolkit.sessions import *  # noqa: F403
from ..toolkit.sessions import __all__  # noqa: F401

warnings.warn(
    "captcha_tasks.state.sessions moved to captcha_tasks.toolkit.sessions; "
    "the old path goes away in the next release",
    DeprecationWarning,
    stacklevel=2,
)

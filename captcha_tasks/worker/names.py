"""The names of captcha-tasks' Celery tasks (what a message is sent to, by any process)."""

from __future__ import annotations

SOLVE = "captcha_tasks.solve"
SUBMIT = "captcha_tasks.submit"
POLL = "captcha_tasks.poll"
REPORT = "captcha_tasks.report"
PREWARM = "captcha_tasks.prewarm"
CHECK_THREADS = "captcha_tasks.check_threads"
PROBE = "captcha_tasks.probe"
#: The gateway's delivery of an answer to a client's own callback URL (registered by
#: ``captcha_tasks.gateway.delivery``, which every worker imports).
GATEWAY_CALLBACK = "captcha_tasks.gateway_callback"

#: The queue (kind) of each task; the names come from CAPTCHAAI_QUEUE_PREFIX.
QUEUE_OF_TASK = {
    SOLVE: "solve",
    SUBMIT: "submit",
    POLL: "poll",
    REPORT: "housekeeping",
    PREWARM: "housekeeping",
    CHECK_THREADS: "housekeeping",
    PROBE: "housekeeping",
    GATEWAY_CALLBACK: "housekeeping",
}

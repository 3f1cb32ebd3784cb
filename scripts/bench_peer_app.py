"""The peer of ``bench_pipeline.py``: the plain Celery ``submit | poll`` chain.

Nothing but what a tutorial would write: ``submit`` posts to ``in.php`` and returns the
captcha id, ``poll`` asks ``res.php`` and retries itself with a countdown while the answer
is not ready.  JSON only, late acknowledgement, like ours.  Run by the benchmark as

    celery -A bench_peer_app worker -P threads -c 32

with ``scripts/`` on ``PYTHONPATH`` and ``REDIS_URL``, ``CAPTCHAAI_BASE_URL`` and
``CAPTCHAAI_API_KEY`` in the environment.
"""

from __future__ import annotations

import os
from typing import Any

import requests
from celery import Celery, Task

app = Celery("bench_peer", broker=os.environ["REDIS_URL"], backend=os.environ["REDIS_URL"])
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)

BASE_URL = os.environ.get("CAPTCHAAI_BASE_URL", "")
KEY = os.environ.get("CAPTCHAAI_API_KEY", "")
POLL_INTERVAL = float(os.environ.get("PEER_POLL_INTERVAL", "0.5"))
_session = requests.Session()


@app.task(name="peer.submit")
def submit(method: str, sitekey: str, pageurl: str) -> str:
    reply = _session.post(
        f"{BASE_URL}/in.php",
        data={"key": KEY, "json": 1, "method": method, "sitekey": sitekey, "pageurl": pageurl},
        timeout=30,
    ).json()
    if reply["status"] != 1:
        raise RuntimeError(reply["request"])
    return str(reply["request"])


@app.task(bind=True, name="peer.poll", max_retries=200)
def poll(self: Task, captcha_id: str) -> Any:
    reply = _session.post(
        f"{BASE_URL}/res.php",
        data={"key": KEY, "json": 1, "action": "get", "id": captcha_id},
        timeout=30,
    ).json()
    if reply["status"] == 1:
        return {"captcha_id": captcha_id, "token": reply["request"]}
    if reply["request"] == "CAPCHA_NOT_READY":
        raise self.retry(countdown=POLL_INTERVAL)
    raise RuntimeError(reply["request"])

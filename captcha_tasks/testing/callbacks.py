"""The sandbox's callbacks: it calls a captcha's ``pingback`` URL when the answer is
ready, the way the providers do.

* CaptchaAI: ``GET <url>?id=<captcha id>&code=<answer>``, no authentication;
* 2captcha: ``POST <url>`` with the form fields ``id`` and ``code``, and only to an
  address registered first with ``res.php?action=add_pingback``;
* the JSON family (Anti-Captcha, CapSolver, CapMonster Cloud): ``POST <callbackUrl>`` of
  the task's ``getTaskResult`` JSON (verb ``"JSON"`` here), which the receiver must accept
  within :data:`JSON_TIMEOUT_S`.

Calls are made by a small thread pool at ``ready + delay``; a call that fails (receiver
down, an error status) is not repeated, as with the providers, so the client must fall
back on polling.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlencode

import urllib3

CALLERS = 8
TIMEOUT_S = 5.0
#: Seconds a receiver has to accept a JSON provider's callback (the providers' 2 s).
JSON_TIMEOUT_S = 2.0


@dataclass(order=True, frozen=True)
class Call:
    """One callback: due ``at`` (the sandbox's clock)."""

    at: float
    seq: int
    url: str = field(compare=False)
    captcha_id: str = field(compare=False)
    #: The answer (in.php), or the JSON body (verb ``"JSON"``).
    code: str = field(compare=False)
    verb: str = field(compare=False)


class Caller:
    """Makes callbacks when they are due; counts what became of them."""

    def __init__(self, clock: Callable[[], float], callers: int = CALLERS) -> None:
        self._clock = clock
        self._due: list[Call] = []
        self._seq = itertools.count()
        self._wake = threading.Condition()
        self._http = urllib3.PoolManager(maxsize=callers, retries=False)
        self._pool = ThreadPoolExecutor(callers, thread_name_prefix="sandbox-pingback")
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="sandbox-pingbacks", daemon=True)
        self._thread.start()
        self.counts = {"pingbacks_sent": 0, "pingbacks_failed": 0}

    def schedule(self, at: float, url: str, captcha_id: str, code: str, verb: str) -> None:
        with self._wake:
            heapq.heappush(self._due, Call(at, next(self._seq), url, captcha_id, code, verb))
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopped and (not self._due or self._due[0].at > self._clock()):
                    wait = self._due[0].at - self._clock() if self._due else None
                    self._wake.wait(wait)
                if self._stopped:
                    return
                call = heapq.heappop(self._due)
            self._pool.submit(self._call, call)

    def _call(self, call: Call) -> None:
        fields = {"id": call.captcha_id, "code": call.code}
        try:
            if call.verb == "JSON":
                resp = self._http.request(
                    "POST",
                    call.url,
                    body=call.code.encode(),
                    headers={"Content-Type": "application/json"},
                    timeout=JSON_TIMEOUT_S,
                )
            elif call.verb == "POST":
                resp = self._http.request(
                    "POST", call.url, fields=fields, encode_multipart=False, timeout=TIMEOUT_S
                )
            else:
                sep = "&" if "?" in call.url else "?"
                resp = self._http.request(
                    "GET", f"{call.url}{sep}{urlencode(fields)}", timeout=TIMEOUT_S
                )
            ok = resp.status < 300
        except (urllib3.exceptions.HTTPError, OSError):
            ok = False
        with self._wake:
            self.counts["pingbacks_sent" if ok else "pingbacks_failed"] += 1

"""Drives one provider SDK against a gateway, in a process of its own: the gateway's tests
run it as a subprocess, ``capmonstercloudclient`` in its own virtual environment
(``tests/pip_cache.py``), the others in the project's.

Reads a job from the JSON file its one argument names::

    {"sdk": "capmonster" | "captchaai" | "2captcha" | "code",
     "url": "https://127.0.0.1:PORT",        # service_url / base_url / server
     "tasks": [{"kind": "recaptcha_v2" | "turnstile" | "image",
                "sitekey": ..., "pageurl": ..., "image": "/path.png"}, ...],
     "time_scale": 0.1,                      # captchaai only: its sleeps, scaled
     "balance": true}                        # ask for the balance after the tasks

or ``{"sdk": "code", "code": "...", "print": ["token"]}``: a documentation example, run with
``GW_KEY`` defined, that prints the names it leaves.

and solves every task at once (asyncio for CapMonster, a thread each for the others), with
the SDK as a user would write it: the host changed, nothing else.  The key is read from
``SDK_DRIVER_KEY`` (never argv: the process list would show it); HTTPS is trusted through
``SSL_CERT_FILE`` / ``REQUESTS_CA_BUNDLE``.  Prints one JSON line per task as it ends,
``{"i": 3, "token": "..."}`` or ``{"i": 3, "error": "GetResultError", "message": "..."}``,
then ``{"balance": 12.0}`` when asked.  Needs nothing but the SDK: no captcha_tasks import.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

_print_lock = threading.Lock()


def emit(line: dict[str, Any]) -> None:
    with _print_lock:
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()


def failed(i: int, exc: BaseException) -> dict[str, Any]:
    return {"i": i, "error": type(exc).__name__, "message": str(exc)}


# -- CapMonster Cloud (capmonstercloudclient) ----------------------------------------------


def run_capmonster(job: dict[str, Any], key: str) -> None:
    from capmonstercloudclient import CapMonsterClient, ClientOptions

    options = ClientOptions(api_key=key, service_url=job["url"])  # the two-line change
    client = CapMonsterClient(options=options)

    async def one(i: int, task: dict[str, Any]) -> None:
        try:
            solution = await client.solve_captcha(capmonster_request(task))
        except Exception as exc:  # reported, one line per task
            emit(failed(i, exc))
            return
        token = solution.get("gRecaptchaResponse") or solution.get("token")
        emit({"i": i, "token": token or solution.get("text"), "solution": solution})

    async def main() -> None:
        await asyncio.gather(*(one(i, t) for i, t in enumerate(job["tasks"])))
        if job.get("balance"):
            try:
                emit({"balance": (await client.get_balance())["balance"]})
            except Exception as exc:
                emit({"balance": None, "error": type(exc).__name__, "message": str(exc)})

    asyncio.run(main())


def capmonster_request(task: dict[str, Any]) -> Any:
    from capmonstercloudclient.requests import (
        ImageToTextRequest,
        RecaptchaV2Request,
        TurnstileRequest,
    )

    if task["kind"] == "recaptcha_v2":
        return RecaptchaV2Request(websiteUrl=task["pageurl"], websiteKey=task["sitekey"])
    if task["kind"] == "turnstile":
        return TurnstileRequest(websiteURL=task["pageurl"], websiteKey=task["sitekey"])
    if task["kind"] == "image":
        return ImageToTextRequest(image_bytes=Path(task["image"]).read_bytes())
    raise ValueError(f"no such task kind: {task['kind']!r}")


# -- CaptchaAI (captchaai) and 2captcha (2captcha-python) ----------------------------------


class _ScaledTime:
    """The ``time`` module as the captchaai SDK sees it, ``sleep`` scaled: it waits as
    against the real API (15 s before a first poll), and its schedule has no setting."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds * self.scale)  # the SDK's own poll schedule, scaled: not a wait of ours


def run_captchaai(job: dict[str, Any], key: str) -> None:
    import captchaai
    import captchaai.client

    captchaai.client.time = _ScaledTime(float(job.get("time_scale", 1.0)))

    def one(i: int, task: dict[str, Any]) -> dict[str, Any]:
        client = captchaai.CaptchaAI(key, base_url=job["url"])  # the two-line change
        try:
            sitekey, pageurl = task["sitekey"], task["pageurl"]
            if task["kind"] == "recaptcha_v2":
                return {"i": i, "token": client.recaptcha_v2(sitekey, pageurl).solution}
            if task["kind"] == "turnstile":
                return {"i": i, "token": client.turnstile(sitekey, pageurl).solution}
            raise ValueError(f"no such task kind here: {task['kind']!r}")
        finally:
            client.close()

    run_threads(job, one)


def run_2captcha(job: dict[str, Any], key: str) -> None:
    from twocaptcha import TwoCaptcha

    server = job["url"].removeprefix("https://")  # 2captcha-python speaks HTTPS only

    def one(i: int, task: dict[str, Any]) -> dict[str, Any]:
        solver = TwoCaptcha(key, server=server, pollingInterval=1, defaultTimeout=60)
        sitekey, pageurl = task["sitekey"], task["pageurl"]
        if task["kind"] == "turnstile":
            return {"i": i, "token": solver.turnstile(sitekey=sitekey, url=pageurl)["code"]}
        if task["kind"] == "recaptcha_v2":
            return {"i": i, "token": solver.recaptcha(sitekey=sitekey, url=pageurl)["code"]}
        raise ValueError(f"no such task kind here: {task['kind']!r}")

    run_threads(job, one)


def run_threads(job: dict[str, Any], one: Any) -> None:
    def guarded(i: int, task: dict[str, Any]) -> None:
        try:
            emit(one(i, task))
        except Exception as exc:  # reported, one line per task
            emit(failed(i, exc))

    tasks = job["tasks"]
    with ThreadPoolExecutor(max_workers=max(1, len(tasks))) as pool:
        list(pool.map(guarded, range(len(tasks)), tasks))


def run_code(job: dict[str, Any], key: str) -> None:
    names: dict[str, Any] = {"__name__": "__example__", "GW_KEY": key}
    exec(compile(job["code"], "example", "exec"), names)
    emit({name: names.get(name) for name in job["print"]})


SDKS = {
    "capmonster": run_capmonster,
    "captchaai": run_captchaai,
    "2captcha": run_2captcha,
    "code": run_code,
}


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    SDKS[job["sdk"]](job, os.environ["SDK_DRIVER_KEY"])


# -- the test's side -----------------------------------------------------------------------


def start(python: str | Path, job: dict[str, Any], key: str, cafile: Path, out: Path) -> Any:
    """Run the driver for ``job`` under ``python`` (a ``subprocess.Popen``); ``out`` is a
    folder for its job file and its stderr.  The SDK's process gets no provider key and
    no Redis address: it is a client somewhere else, which knows the gateway only."""
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    name = f"{job['sdk']}-{os.urandom(3).hex()}"
    (out / f"{name}.json").write_text(json.dumps(job))
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CAPTCHAAI_", "REDIS_"))}
    environ.update(
        SDK_DRIVER_KEY=key,
        SSL_CERT_FILE=str(cafile),  # aiohttp (CapMonster), httpx (captchaai)
        REQUESTS_CA_BUNDLE=str(cafile),  # requests (2captcha-python)
        PYTHONUNBUFFERED="1",
    )
    with open(out / f"{name}.stderr", "wb") as stderr:
        return subprocess.Popen(
            [str(python), __file__, str(out / f"{name}.json")],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=environ,
            text=True,
        )


def finish(proc: Any, timeout: float) -> list[dict[str, Any]]:
    """The lines the driver printed, once it has exited (within ``timeout`` seconds) with
    status 0; AssertionError with its stderr otherwise."""
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    stderr = Path(proc.args[2]).with_suffix(".stderr").read_text(errors="replace")
    assert proc.returncode == 0, f"the driver exited {proc.returncode}:\n{stderr[-3000:]}"
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


if __name__ == "__main__":
    main()

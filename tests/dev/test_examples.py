"""The Flask and Django examples, through each framework's test client, against a real
worker, Redis and the sandbox.  One body per behaviour, run for both frameworks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celery
import pytest
from celery import _state as celery_state
from celery.signals import before_task_publish
from cheroot import wsgi

import captcha_tasks
from captcha_tasks.receiver import default_receiver
from captcha_tasks.testing.processes import CeleryProcess, free_port, wait_until

pytestmark = pytest.mark.system

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PAGE = "https://example.com/signup"
GOOD = {"method": "turnstile", "sitekey": "0x4AAAAAAAexample", "pageurl": PAGE}
Reply = tuple[int, Any]


@dataclass
class Framework:
    """One example app as the tests drive it."""

    name: str
    path: Path  #: the folder a worker of the example runs from (on PYTHONPATH)
    celery_arg: str  #: ``celery -A <celery_arg> worker``
    queue: str
    celery_app: Any
    solve_url: str
    status_url: Callable[[str], str]
    add_url: str
    add_result_url: Callable[[str], str]
    add_fields: tuple[str, str]
    post_json: Callable[[str, Any], Reply]
    post_form: Callable[[str, dict[str, str]], Reply]
    get: Callable[[str], Reply]
    env: dict[str, str]
    wsgi: Any  #: the app as a WSGI application, to serve it over HTTP


def _flask() -> Framework:
    from flask_app import QUEUE, create_app

    app = create_app({"TESTING": True})
    client = app.test_client()

    def post_json(url: str, body: Any) -> Reply:
        data = body if isinstance(body, str) else json.dumps(body)
        resp = client.post(url, data=data, content_type="application/json")
        return resp.status_code, resp.get_json(silent=True)

    def post_form(url: str, form: dict[str, str]) -> Reply:
        resp = client.post(url, data=form)
        return resp.status_code, resp.get_json(silent=True)

    def get(url: str) -> Reply:
        resp = client.get(url)
        return resp.status_code, resp.get_json(silent=True)

    return Framework(
        name="flask",
        path=EXAMPLES / "flask_app",
        celery_arg="make_celery",
        queue=QUEUE,
        celery_app=app.extensions["celery"],
        solve_url="/captchas",
        status_url=lambda task_id: f"/captchas/{task_id}",
        add_url="/add",
        add_result_url=lambda task_id: f"/add/{task_id}",
        add_fields=("a", "b"),
        post_json=post_json,
        post_form=post_form,
        get=get,
        env={},
        wsgi=app,
    )


def _django() -> Framework:
    import django
    from django.test.utils import setup_test_environment

    # Only while Django starts: a worker started later must not inherit it (Celery would
    # apply its Django fix-up to captcha-tasks' worker).
    os.environ["DJANGO_SETTINGS_MODULE"] = "proj.settings"
    try:
        django.setup()
    finally:
        del os.environ["DJANGO_SETTINGS_MODULE"]
    setup_test_environment()
    from django.core.wsgi import get_wsgi_application
    from django.test import Client
    from proj.celery import app as project_celery

    client = Client()

    def post_json(url: str, body: Any) -> Reply:
        data = body if isinstance(body, str) else json.dumps(body)
        resp = client.post(url, data=data, content_type="application/json")
        return resp.status_code, resp.json()

    def post_form(url: str, form: dict[str, str]) -> Reply:
        resp = client.post(url, data=form)
        return resp.status_code, resp.json()

    def get(url: str) -> Reply:
        resp = client.get(url)
        return resp.status_code, resp.json()

    return Framework(
        name="django",
        path=EXAMPLES / "django_project",
        celery_arg="proj",
        queue="django",
        celery_app=project_celery,
        solve_url="/captchas/",
        status_url=lambda task_id: f"/captchas/{task_id}/",
        add_url="/add/",
        add_result_url=lambda task_id: f"/add/{task_id}/",
        add_fields=("x", "y"),
        post_json=post_json,
        post_form=post_form,
        get=get,
        env={"DJANGO_SETTINGS_MODULE": "proj.settings"},
        wsgi=get_wsgi_application(),
    )


#: Provider callbacks reach the example apps here (served over HTTP by the pingback test).
CALLBACK_PORT = free_port()
#: Callbacks on, for the module's worker and for the views' receiver in this process.
MODULE_ENV = {
    "CAPTCHAAI_PINGBACK_URL": f"http://127.0.0.1:{CALLBACK_PORT}/captcha/pingback",
    "CAPTCHAAI_PINGBACK_SECRET": "examples-pingback-secret",
    # while no app listens (the other tests), a captcha is polled soon after its solve time
    "CAPTCHAAI_PINGBACK_FALLBACK_POLL": "2",
    # before its solve times are known, a captcha is first polled after this: longer than
    # the callback of the pingback test takes (the sandbox's 0.3 s solves), so it comes first
    "CAPTCHAAI_INITIAL_WAIT": "2",
}


@pytest.fixture(scope="module", autouse=True)
def fresh_receiver(isolated_module: str) -> Iterator[None]:
    """The views' receiver of this module's settings (it is built once per process)."""
    default_receiver.cache_clear()
    yield
    default_receiver.cache_clear()


@pytest.fixture(scope="module", params=["flask", "django"])
def framework(request: pytest.FixtureRequest, worker: CeleryProcess) -> Iterator[Framework]:
    """The example app in this process (after the worker started: see ``_django``)."""
    saved_path = list(sys.path)
    # Flask's guide calls set_default() and every Celery() becomes current: put back ours.
    saved_current = celery.current_app._get_current_object()
    saved_default = celery_state.default_app
    build = _flask if request.param == "flask" else _django
    sys.path.insert(
        0, str(EXAMPLES / ("flask_app" if request.param == "flask" else "django_project"))
    )
    try:
        yield build()
    finally:
        if request.param == "django":
            from django.test.utils import teardown_test_environment

            teardown_test_environment()
        sys.path[:] = saved_path
        saved_current.set_current()
        celery_state.set_default_app(saved_default)


# -- solving through the views -------------------------------------------------------------


def _finished(framework: Framework, status_url: str) -> dict[str, Any] | None:
    status, body = framework.get(status_url)
    assert status == 200, body
    return dict(body) if body["state"] in ("SUCCESS", "FAILURE") else None


def test_solve_through_the_views(framework: Framework, sandbox: Any, clean_state: None) -> None:
    status, body = framework.post_json(framework.solve_url, GOOD)
    assert status == 202, body
    assert body["status_url"] == framework.status_url(body["task_id"])

    done = wait_until(
        lambda: _finished(framework, body["status_url"]), 60, interval=0.1, what="the solve"
    )
    assert isinstance(done, dict)
    assert done["state"] == "SUCCESS", done
    outcome = done["result"]
    assert outcome["status"] == "solved"
    assert outcome["method"] == "turnstile"
    assert sandbox.verify(outcome["token"])["success"] is True


def test_provider_callbacks_reach_the_mounted_receiver(
    framework: Framework, sandbox: Any, clean_state: None, state: Any
) -> None:
    server = wsgi.Server(("127.0.0.1", CALLBACK_PORT), framework.wsgi, numthreads=4)
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        status, body = framework.post_json(framework.solve_url, GOOD)
        assert status == 202, body
        done = wait_until(
            lambda: _finished(framework, body["status_url"]), 30, interval=0.1, what="the solve"
        )
    finally:
        server.stop()
        thread.join()
    assert isinstance(done, dict) and done["state"] == "SUCCESS", done
    assert sandbox.verify(done["result"]["token"])["success"] is True
    # counted by the sandbox when the app's reply is back: maybe after the result
    wait_until(lambda: sandbox.stats()["pingbacks_sent"] == 1, 10, what="the reply")
    assert state.stats.solved("turnstile") == {"pingback": 1}
    assert state.stats.callback_counts() == {"accepted": 1}


def test_unknown_task_id_is_pending(framework: Framework) -> None:
    status, body = framework.get(framework.status_url("no-such-id"))
    assert status == 200
    assert body["state"] == "PENDING"


@pytest.fixture
def published() -> Iterator[list[str]]:
    """Names of the tasks this process publishes while the test runs."""
    sent: list[str] = []

    def record(sender: str | None = None, **_: Any) -> None:
        sent.append(str(sender))

    before_task_publish.connect(record, weak=False)
    yield sent
    before_task_publish.disconnect(record)


def _queue_lengths(redis_conn: Any) -> dict[str, int]:
    """The lengths of the queues a request could fill: not housekeeping's, where the
    deployment's own periodic work comes and goes meanwhile (a CI run saw one arrive)."""
    celery = captcha_tasks.app.runtime().settings.celery
    queues = [q for q in celery.queues if q != celery.queue("housekeeping")]
    return {queue: int(redis_conn.llen(queue)) for queue in queues}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({**GOOD, "method": "hcaptcha-nope"}, "method"),
        ({"method": "turnstile", "sitekey": "k"}, "pageurl"),
        ({**GOOD, "pageurl": "ftp://example.com/"}, "pageurl"),
        ({**GOOD, "colour": "blue"}, "colour"),
        ("this is not JSON", "JSON object"),
        (["turnstile"], "JSON object"),
    ],
)
def test_bad_parameters_are_400_and_nothing_is_queued(
    framework: Framework, redis_conn: Any, published: list[str], body: Any, message: str
) -> None:
    before = _queue_lengths(redis_conn)
    status, reply = framework.post_json(framework.solve_url, body)
    assert status == 400
    assert reply["error"] == "validation"
    assert message in reply["message"]
    assert published == []
    assert _queue_lengths(redis_conn) == before


# -- two Celery apps, one Redis ------------------------------------------------------------


class FrameworkWorker(CeleryProcess):
    """``celery -A <the example's app> worker -Q <its queue>`` from the example's folder."""

    def __init__(self, framework: Framework, log_dir: Path) -> None:
        pythonpath = os.pathsep.join(
            p for p in (str(framework.path), os.environ.get("PYTHONPATH")) if p
        )
        env = {**framework.env, "PYTHONPATH": pythonpath}
        super().__init__(
            "worker",
            env=env,
            concurrency=2,
            queues=(framework.queue,),
            name=f"{framework.name}-app-worker",
            log_dir=log_dir,
        )
        self.celery_arg = framework.celery_arg

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", self.celery_arg, "worker",
            "-P", "threads", "-c", str(self.concurrency), "-Q", ",".join(self.queues),
            "-n", f"{self.node}@%h", "-l", "INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip


OUR_TASKS = ("captcha_tasks.solve", "captcha_tasks.submit", "captcha_tasks.poll")


def test_framework_worker_runs_beside_ours(
    framework: Framework, worker: CeleryProcess, sandbox: Any, output_dir: Path, clean_state: None
) -> None:
    # Our tasks stay on our app, with our configuration; theirs on theirs.
    for name in OUR_TASKS:
        assert name not in framework.celery_app.tasks, (
            f"{name} re-registered on the {framework.name} app"
        )
    assert captcha_tasks.solve.app is captcha_tasks.app

    with FrameworkWorker(framework, output_dir) as theirs:
        theirs.start()
        a, b = framework.add_fields
        status, body = framework.post_form(framework.add_url, {a: "2", b: "3"})
        assert status == 202, body
        result_url = framework.add_result_url(body["task_id"])
        done = wait_until(
            lambda: (reply := framework.get(result_url)[1])["state"] == "SUCCESS" and reply,
            30,
            interval=0.1,
            what=f"the {framework.name} app's task",
        )
        assert isinstance(done, dict) and done["result"] == 5

        # And a solve at the same time, on our worker.
        status, solve_body = framework.post_json(framework.solve_url, GOOD)
        assert status == 202
        solved = wait_until(
            lambda: _finished(framework, solve_body["status_url"]), 60, interval=0.1
        )
        assert isinstance(solved, dict) and solved["state"] == "SUCCESS", solved
        their_log = theirs.log_text()

    assert f"Task {_task_name(framework)}[" in their_log  # it ran there ...
    assert _task_name(framework) not in worker.log_text()  # ... and never reached ours
    for name in OUR_TASKS:
        assert f"Task {name}[" not in their_log


def _task_name(framework: Framework) -> str:
    return "flask_app.tasks.add_together" if framework.name == "flask" else "captchas.tasks.add"


PROBE = """
import json, celery, os, sys
import {module}
from captcha_tasks import solve
from {task_module} import {task} as theirs
app = {app_expr}
print(json.dumps({{
    "current": celery.current_app.main,
    "theirs_on": theirs._get_current_object().app.main,
    "solve_on": solve.app.main,
    "ours_registered_there": sorted(n for n in app.tasks if n.startswith("captcha_tasks.")),
    "their_queue": app.amqp.router.route({{}}, theirs.name)["queue"].name,
}}))
"""


def test_a_fresh_process_keeps_each_app_to_itself(framework: Framework) -> None:
    """As in production: the example imported in a new process, in its own import order."""
    if framework.name == "flask":
        code = PROBE.format(
            module="make_celery",
            task_module="flask_app.tasks",
            task="add_together",
            app_expr="make_celery.celery_app",
        )
        expected_main = "flask_app"
    else:
        code = "import django; django.setup(); import captchas.views\n" + PROBE.format(
            module="proj.celery",
            task_module="captchas.tasks",
            task="add",
            app_expr="proj.celery.app",
        )
        expected_main = "proj"
    pythonpath = os.pathsep.join(
        p for p in (str(framework.path), os.environ.get("PYTHONPATH")) if p
    )
    env = {**os.environ, **framework.env, "PYTHONPATH": pythonpath}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=framework.path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "current": expected_main,
        "theirs_on": expected_main,
        "solve_on": "captcha_tasks",
        "ours_registered_there": [],
        "their_queue": framework.queue,
    }


# -- a host project's own celeryconfig ------------------------------------------------------

#: What a Django project's own ``celeryconfig.py`` (at its root, first on sys.path) might
#: say: none of it may reach captcha-tasks' app.
THEIR_CELERYCONFIG = """
broker_url = "memory://"
result_backend = "cache+memory://"
task_serializer = "pickle"
accept_content = ["pickle", "json"]
task_default_queue = "django"
task_acks_late = False
"""


def test_a_project_celeryconfig_never_replaces_ours(
    tmp_path: Path, output_dir: Path, sandbox: Any, env: dict[str, str]
) -> None:
    import shutil

    project = tmp_path / "django_project"
    shutil.copytree(EXAMPLES / "django_project", project)
    (project / "celeryconfig.py").write_text(THEIR_CELERYCONFIG)
    env = {**env, "DJANGO_SETTINGS_MODULE": "proj.settings", "PYTHONPATH": str(project)}
    probe = (
        "import json, django; django.setup()\n"
        "import celeryconfig, captcha_tasks\n"
        "conf = captcha_tasks.app.conf\n"
        "print(json.dumps([celeryconfig.__file__, conf.task_serializer, conf.accept_content,\n"
        "                  conf.task_default_queue, conf.task_acks_late, conf.broker_url]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    theirs, serializer, accept, queue, acks_late, broker = json.loads(done.stdout.splitlines()[-1])
    assert Path(theirs).parent == project  # their module is the one Python finds
    ours = f"{env['CAPTCHAAI_QUEUE_PREFIX']}.solve"
    assert (serializer, accept, queue, acks_late) == ("json", ["json"], ours, True)
    assert broker == os.environ["REDIS_URL"]
    # A worker started from the project's root solves with our configuration too.
    worker = CeleryProcess(
        "worker", env=env, log_dir=output_dir, name="celeryconfig-shadow", cwd=project
    )
    with worker:
        worker.start()
        result = captcha_tasks.solve.delay(**GOOD).get(timeout=30)
    assert result["status"] == "solved"
    assert sandbox.verify(result["token"])["success"] is True

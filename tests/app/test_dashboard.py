"""The Grafana dashboard (ops/grafana): every query uses a metric, and labels, that a live
exporter serves while a real worker fills Redis; the compose stack provisions it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from captcha_tasks import solve
from captcha_tasks.errors import FatalError
from captcha_tasks.gateway import GatewayServer
from captcha_tasks.receiver.callbacks import Receiver
from captcha_tasks.receiver.server import PingbackServer
from captcha_tasks.testing.processes import CeleryProcess, wait_until
from captcha_tasks.worker.app import app
from captcha_tasks.worker.runtime import Runtime
from captcha_tasks.worker.tasks import create_pool, prewarm

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "ops" / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
DASHBOARD_FILES = sorted(DASHBOARDS.glob("*.json"))
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DATASOURCE_VARIABLE = "DS_PROMETHEUS"

#: A PromQL metric name of ours: not part of a longer identifier (a label, a function).
METRIC = re.compile(r"(?<![A-Za-z0-9_:])captcha_tasks_[A-Za-z0-9_:]*")
#: Metrics read through rate() and the like, which only make sense on counters (a
#: histogram's cumulative buckets among them).
RATED = re.compile(r"\b(?:rate|irate|increase)\(\s*(captcha_tasks_[A-Za-z0-9_:]*)")
#: Label names in `by (...)` / `without (...)` and in selectors `{name=~"..."}`.
GROUPED = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
SELECTOR = re.compile(r"\{([^}]*)\}")
MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
#: label_values(metric, label) of a template variable.
LABEL_VALUES = re.compile(r"label_values\(\s*(captcha_tasks_[A-Za-z0-9_:]*)\s*,\s*(\w+)\s*\)")
#: What Prometheus asks an exporter for: OpenMetrics first.
PROMETHEUS_ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4"

PAGE = "https://example.com/dashboard"
#: A tenant with a cap and a budget: every tenant figure is served.
SHOP = {"weight": 2, "max_threads": 10, "daily_captchas": 100, "key_env": "GW_SHOP_KEY"}
MODULE_ENV = {"CAPTCHAAI_TENANTS": json.dumps({"shop": SHOP})}
POOL = "dashboard-pool"
SECRET = "dashboard-test-secret-" + "x" * 8
GATEWAY_KEY = "d0a5b0a2d" + "k" * 23


# -- reading the dashboard -----------------------------------------------------------------


def metrics_in(expr: str) -> set[str]:
    """The ``captcha_tasks_*`` metric names a PromQL expression reads."""
    return set(METRIC.findall(expr))


def labels_in(expr: str) -> set[str]:
    """Label names an expression groups by or selects on."""
    names = {n.strip() for group in GROUPED.findall(expr) for n in group.split(",")}
    for selector in SELECTOR.findall(expr):
        names.update(MATCHER.findall(selector))
    return {n for n in names if n}


def unserved(used: set[str], served: set[str]) -> set[str]:
    """Metric names the dashboard uses that no scraped sample has."""
    return used - served


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        if panel.get("type") == "row":  # a row holds panels; it queries nothing itself
            yield from _panels(panel.get("panels", []))
        else:
            yield panel


def _variable_query(variable: dict[str, Any]) -> str:
    query = variable.get("query", "")
    return str(query.get("query", "")) if isinstance(query, dict) else str(query)


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """Every query the dashboard sends to Prometheus, as ``(where, expression)``."""
    found = [
        (f"panel {panel['title']!r} target {target.get('refId')}", str(target.get("expr", "")))
        for panel in _panels(dashboard["panels"])
        for target in panel.get("targets", [])
    ]
    found += [
        (f"variable {variable['name']}", _variable_query(variable))
        for variable in dashboard["templating"]["list"]
        if variable["type"] == "query"
    ]
    return found


def _load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(params=DASHBOARD_FILES, ids=lambda p: p.name)
def dashboard(request: pytest.FixtureRequest) -> dict[str, Any]:
    return _load(request.param)


@pytest.mark.redis
def test_there_is_a_dashboard() -> None:
    assert [p.name for p in DASHBOARD_FILES] == ["captcha-tasks.json"]


# -- the extraction itself -----------------------------------------------------------------


@pytest.mark.redis
def test_the_extraction_catches_a_made_up_metric() -> None:
    expr = (
        'sum by (code, le) (rate(captcha_tasks_made_up_total{pool=~"$pool"}[5m]))'
        " / on() captcha_tasks_threads_plan + my_captcha_tasks_other"
    )
    assert metrics_in(expr) == {"captcha_tasks_made_up_total", "captcha_tasks_threads_plan"}
    assert labels_in(expr) == {"code", "le", "pool"}
    assert RATED.findall(expr) == ["captcha_tasks_made_up_total"]
    served = {"captcha_tasks_threads_plan", "captcha_tasks_made_up"}  # the family, not _total
    assert unserved(metrics_in(expr), served) == {"captcha_tasks_made_up_total"}


@pytest.mark.redis
def test_histogram_suffixes_are_part_of_the_name() -> None:
    expr = "histogram_quantile(0.9, sum by (le) (captcha_tasks_solve_seconds_bucket))"
    assert metrics_in(expr) == {"captcha_tasks_solve_seconds_bucket"}
    assert unserved(metrics_in(expr), {"captcha_tasks_solve_seconds_gcount"})


# -- the dashboard's shape -----------------------------------------------------------------


def _balanced(expr: str) -> bool:
    pairs, stack = {")": "(", "]": "[", "}": "{"}, []
    for char in re.sub(r'"[^"]*"', '""', expr):  # brackets inside strings do not count
        if char in "([{":
            stack.append(char)
        elif char in pairs and (not stack or stack.pop() != pairs[char]):
            return False
    return not stack


@pytest.mark.redis
def test_every_panel_queries_the_exporter(dashboard: dict[str, Any]) -> None:
    panels = list(_panels(dashboard["panels"]))
    assert panels
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    cells = [
        (x, y, panel["title"])
        for panel in panels
        for x in range(panel["gridPos"]["x"], panel["gridPos"]["x"] + panel["gridPos"]["w"])
        for y in range(panel["gridPos"]["y"], panel["gridPos"]["y"] + panel["gridPos"]["h"])
    ]
    taken: dict[tuple[int, int], str] = {}
    for x, y, title in cells:
        assert (x, y) not in taken, f"panels {taken[x, y]!r} and {title!r} overlap"
        taken[x, y] = title
    source = {"type": "prometheus", "uid": f"${{{DATASOURCE_VARIABLE}}}"}
    for panel in panels:
        title, targets = panel["title"], panel.get("targets", [])
        assert targets, f"panel {title!r} has no query"
        assert panel["datasource"] == source, title
        refs = [target["refId"] for target in targets]
        assert len(refs) == len(set(refs)), f"panel {title!r} repeats a refId"
        for target in targets:
            assert target["datasource"] == source, title
    for where, expr in expressions(dashboard):
        assert metrics_in(expr), f"{where} reads no captcha_tasks_ metric: {expr!r}"
        assert _balanced(expr), f"{where}: unbalanced brackets in {expr!r}"


@pytest.mark.redis
def test_the_data_source_is_a_variable(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    source = variables[DATASOURCE_VARIABLE]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    assert "__inputs" not in dashboard  # an export's placeholders break file provisioning


@pytest.mark.redis
def test_the_dashboard_shows_what_operators_look_for(dashboard: dict[str, Any]) -> None:
    exprs = [expr for _, expr in expressions(dashboard)]
    used = set().union(*(metrics_in(e) for e in exprs))
    wanted = {
        f"captcha_tasks_{name}"
        for name in (
            "threads_in_use",
            "threads_capacity",
            "threads_plan",
            "thread_utilisation_ratio",
            "parked_submits",
            "pool_live_tokens",
            "pool_target_tokens",
            "pool_hit_ratio",
            "pool_waste_ratio",
            "solve_seconds_bucket",
            "solved_total",
            "api_errors_total",
            "pingback_accepted_total",
            "pingback_rejected_total",
            "pingback_channel",
            "pingback_callback_share",
            "pingback_callbacks_overdue_total",
            "pingback_answer_late_seconds_bucket",
            "lane_in_flight",
            "lane_parked",
            "lane_solved_total",
            "lane_failed_total",
            "wait_seconds_bucket",
            "tenant_submitted_today",
            "tenant_daily_budget",
            "queue_messages",
            "gateway_requests_total",
            "gateway_errors_total",
            "gateway_request_seconds_bucket",
        )
    }
    assert wanted <= used, f"not on the dashboard: {wanted - used}"
    quantiles = {
        q
        for e in exprs
        for q in re.findall(r"histogram_quantile\(\s*([0-9.]+)\s*,", e)
        if "by (le, method)" in e
    }
    assert quantiles == {"0.5", "0.9", "0.99"}
    grouped = {tuple(g.replace(" ", "").split(",")) for e in exprs for g in GROUPED.findall(e)}
    assert {("source",), ("code",), ("reason",), ("lane", "tenant"), ("le", "lane")} <= grouped
    assert {("tenant", "protocol", "endpoint"), ("le", "endpoint")} <= grouped


# -- provisioning by the compose stack -----------------------------------------------------


def _mounts(service: str) -> dict[str, str]:
    """Bind mounts of a service: repository path -> container path."""
    mounts = {}
    for volume in SERVICES[service]["volumes"]:
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts[str((ROOT / source).resolve())] = target
    return mounts


def _provisioning(kind: str) -> list[dict[str, Any]]:
    files = sorted((GRAFANA / "provisioning" / kind).glob("*.yml"))
    assert files, f"no {kind} provisioning file"
    return [yaml.safe_load(path.read_text()) for path in files]


@pytest.mark.redis
def test_grafana_provisions_the_dashboard_folder() -> None:
    mounts = _mounts("grafana")
    assert mounts[str((GRAFANA / "provisioning").resolve())] == "/etc/grafana/provisioning"
    dashboards_in_container = mounts[str(DASHBOARDS.resolve())]
    providers = [p for config in _provisioning("dashboards") for p in config["providers"]]
    assert [p["options"]["path"] for p in providers] == [dashboards_in_container]
    assert all(p["type"] == "file" for p in providers)
    home = SERVICES["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home in {f"{dashboards_in_container}/{p.name}" for p in DASHBOARD_FILES}


def _option(service: str, option: str) -> str:
    """The value of ``--option=value`` in a service's command."""
    for arg in SERVICES[service]["command"]:
        if arg.startswith(f"{option}="):
            return str(arg.removeprefix(f"{option}="))
    raise AssertionError(f"{service} has no {option}")


@pytest.mark.redis
def test_the_data_source_is_the_stacks_prometheus() -> None:
    sources = [s for config in _provisioning("datasources") for s in config["datasources"]]
    assert len(sources) == 1
    source = sources[0]
    assert (source["type"], source["isDefault"]) == ("prometheus", True)
    port = _option("prometheus", "--web.listen-address").rpartition(":")[2]
    assert source["url"] == f"http://prometheus:{port}"
    assert "prometheus" in SERVICES["grafana"]["depends_on"]


@pytest.mark.redis
def test_prometheus_scrapes_the_exporter() -> None:
    config_path = _option("prometheus", "--config.file")
    mounts = {target: source for source, target in _mounts("prometheus").items()}
    config = yaml.safe_load(Path(mounts[config_path]).read_text())
    metrics = SERVICES["metrics"]["command"]
    port = metrics[metrics.index("--port") + 1]
    targets = [
        target
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    ]
    assert targets == [f"metrics:{port}"]
    assert config["scrape_configs"][0].get("metrics_path", "/metrics") == "/metrics"


# -- against a live exporter ---------------------------------------------------------------

#: Sample name -> (family type, label names seen on it).
Served = dict[str, tuple[str, set[str]]]


def scrape(url: str) -> Served:
    """What Prometheus would store from one scrape: each sample name (``_total``,
    ``_bucket``, ``_gcount``, ``_gsum`` included) with its family's type and labels."""
    resp = requests.get(url, headers={"Accept": PROMETHEUS_ACCEPT}, timeout=10)
    assert resp.status_code == 200, resp.text
    assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
    served: Served = {}
    for family in text_string_to_metric_families(resp.text):  # type: ignore[no-untyped-call]
        for sample in family.samples:
            _, labels = served.setdefault(sample.name, (family.type, set()))
            labels.update(sample.labels)
    return served


def _fill_a_pool() -> None:
    """A pool with one miss, a refill and one hit: every pool ratio is defined."""
    pools = app.runtime().state.pools
    create_pool(POOL, "turnstile", "dashboard-key", PAGE, size=2, ttl=120)
    pools.reset_stats(POOL)
    assert pools.take(POOL) is None
    assert prewarm.delay(POOL).get(timeout=30)[POOL] >= 1

    def idle() -> bool:
        status = pools.status(POOL)
        return bool(status["live"] >= 1 and status["inflight"] == 0)

    wait_until(idle, 30, interval=0.1, what="the pool refills")
    assert pools.take(POOL) is not None


def _reject_a_callback() -> None:
    """One forged provider callback, refused by a real receiver."""
    settings = app.runtime().settings.replace(pingback={"secret": SECRET})
    receiver = Receiver(Runtime(app, settings, app.runtime().state).runner)
    server = PingbackServer(receiver).start()
    try:
        resp = requests.get(
            f"http://127.0.0.1:{server.port}/captcha/pingback/forged",
            params={"id": "1", "code": "token"},
            timeout=10,
        )
    finally:
        server.stop()
    assert resp.status_code >= 400


def _ask_the_gateway() -> None:
    """A solve through a real gateway and one request with a wrong key: its requests,
    errors and answer times are counted (written to Redis when it stops)."""
    server = GatewayServer(environ={"GW_SHOP_KEY": GATEWAY_KEY}).start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        fields = {"method": "turnstile", "sitekey": "k", "pageurl": PAGE, "json": 1}
        sent = requests.post(f"{url}/in.php", data={**fields, "key": GATEWAY_KEY}, timeout=10)
        assert sent.json()["status"] == 1, sent.text
        wrong = requests.post(f"{url}/in.php", data={**fields, "key": "w" * 32}, timeout=10)
        assert wrong.json()["request"] == "ERROR_KEY_DOES_NOT_EXIST"
    finally:
        server.stop()


@pytest.mark.e2e
def test_every_query_reads_what_a_live_exporter_serves(
    worker: CeleryProcess, sandbox: Any, clean_state: None, metrics_url: str
) -> None:
    results = [
        solve.delay(method="turnstile", sitekey="k", pageurl=PAGE, tenant=tenant)
        for tenant in ("default", "shop")
    ]
    assert all(r.get(timeout=30)["status"] == "solved" for r in results)
    with pytest.raises(FatalError):  # counted under its error code
        solve.delay(method="turnstile", sitekey="k", pageurl=PAGE, proxy="u:p@bad-proxy:1").get(
            timeout=30
        )
    _fill_a_pool()
    _reject_a_callback()
    _ask_the_gateway()

    served = scrape(metrics_url)
    for path in DASHBOARD_FILES:
        for where, expr in expressions(_load(path)):
            used = metrics_in(expr)
            missing = unserved(used, set(served))
            assert not missing, f"{path.name} {where} reads {missing}, not served"
            labels = set().union(*(served[m][1] for m in used))
            assert labels_in(expr) <= labels, f"{where}: no such label in {expr!r}"
            for rated in RATED.findall(expr):
                # a histogram's buckets are counters too (a gauge histogram's are not)
                kind = served[rated][0]
                assert kind in ("counter", "histogram"), f"{where}: rate() of a {kind}"
            for metric, label in LABEL_VALUES.findall(expr):
                assert label in served[metric][1], f"{where}: {metric} has no label {label}"
            if "histogram_quantile" in expr:
                kinds = {served[m][0] for m in used}
                assert kinds <= {"histogram", "gaugehistogram"}, f"{where}: {kinds}"

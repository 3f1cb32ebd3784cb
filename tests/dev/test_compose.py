"""docker-compose.yml, .env.example and the Dockerfile, checked without Docker: every
command is a real entry point with real options, every variable is one something reads,
ports do not clash, one beat, a durable and password-protected Redis."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
import redis
import yaml

import captcha_tasks
from captcha_tasks.cli import cli
from captcha_tasks.settings import (
    ENVIRONMENT_VARIABLES,
    PROVIDER_KEY_SLOTS,
    RedisSettings,
    Settings,
)
from captcha_tasks.testing.processes import RedisServer, find_redis_server, free_port, wait_until

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_TEXT)
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
ENV_EXAMPLE_LINES = (ROOT / ".env.example").read_text().splitlines()

#: Variables read by something other than our settings: Flower's login, Redis' own and
#: Grafana's admin password (handed to Grafana as GF_SECURITY_ADMIN_PASSWORD).
FOREIGN_VARIABLES = {
    "FLOWER_BASIC_AUTH",
    "REDIS_PASSWORD",
    "REDISCLI_AUTH",
    "GRAFANA_ADMIN_PASSWORD",
}
KNOWN_VARIABLES = ENVIRONMENT_VARIABLES | FOREIGN_VARIABLES | set(PROVIDER_KEY_SLOTS)
#: Settings that are not the workers' business.
NOT_FOR_WORKERS = {
    "CAPTCHAAI_FLOWER_NO_AUTH",
    # the receiver's alone
    "CAPTCHAAI_PINGBACK_TRUSTED_PROXIES",
    "CAPTCHAAI_PINGBACK_ALLOW",
    # the gateway's alone
    "CAPTCHAAI_GATEWAY_TRUSTED_PROXIES",
    "CAPTCHAAI_GATEWAY_ALLOW",
}
SECRETS = (
    "REDIS_PASSWORD",
    "REDIS_SENTINEL_PASSWORD",
    "CAPTCHAAI_API_KEY",
    *PROVIDER_KEY_SLOTS,
    "FLOWER_BASIC_AUTH",
    "CAPTCHAAI_PINGBACK_SECRET",
    "GRAFANA_ADMIN_PASSWORD",
)
#: The `ha` profile: a replica of `redis` and three sentinels watching it.
SENTINELS = ("sentinel-1", "sentinel-2", "sentinel-3")
HA = ("redis-replica", *SENTINELS)
#: Services that run another project's image.
THIRD_PARTY = {"redis", "kafka", "prometheus", "grafana", *HA}
#: Third-party services configured through their image's own variables, by prefix.
OWN_VARIABLES = {"kafka": "KAFKA_", "grafana": "GF_"}
APP_SERVICES = sorted(name for name in SERVICES if name not in THIRD_PARTY)


def _interpolated(text: str) -> set[str]:
    """Names compose substitutes (``${NAME}``, ``${NAME:-x}``, ``${NAME:?x}``); ``$$`` is a
    literal dollar for the container's shell."""
    return set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", text))


def _env_example() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in ENV_EXAMPLE_LINES:
        if line.strip() and not line.lstrip().startswith("#"):
            name, sep, value = line.partition("=")
            assert sep, f".env.example: not NAME=value: {line!r}"
            assert name not in values, f".env.example sets {name} twice"
            values[name] = value
    return values


def _command(service: str) -> list[str]:
    command = SERVICES[service]["command"]
    return list(command) if isinstance(command, list) else shlex.split(command)


# -- commands ------------------------------------------------------------------------------


def _check_celery_command(argv: list[str]) -> None:
    assert argv[:3] == ["celery", "-A", "captcha_tasks"], argv
    name, args = argv[3], argv[4:]
    assert name in ("worker", "beat", "flower"), argv
    if name == "flower":
        from flower.options import default_options

        for arg in args:
            option = arg.lstrip("-").partition("=")[0]
            assert option in default_options, f"Flower has no option --{option}"
        return
    # Parse the options as `celery` would: an unknown option is a UsageError.  Imported
    # here: the group's module imports every subcommand and plugin (~0.6 CPU-s), and every
    # test process of the run collects this module.
    from celery.bin.base import CLIContext
    from celery.bin.celery import celery as celery_group

    parent = click.Context(
        celery_group,
        obj=CLIContext(app=captcha_tasks.app, no_color=True, workdir=None, quiet=True),
    )
    celery_group.commands[name].make_context(name, list(args), parent=parent)


def _check_cli_command(argv: list[str]) -> None:
    assert argv[0] == "captcha-tasks", argv
    name = argv[1]
    command = cli.get_command(click.Context(cli), name)
    assert command is not None, f"captcha-tasks has no {name!r} command (yet)"
    command.make_context(name, argv[2:])  # unknown options raise


@pytest.mark.parametrize("service", APP_SERVICES)
def test_every_command_is_a_real_entry_point(service: str) -> None:
    argv = _command(service)
    if argv[0] == "celery":
        _check_celery_command(argv)
    else:
        _check_cli_command(argv)


def test_the_dockerfile_default_command_is_a_worker() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.MULTILINE)
    assert cmd is not None
    argv = yaml.safe_load(cmd.group(1))
    _check_celery_command(argv)
    assert argv[3] == "worker"
    assert re.search(r"^USER (?!root)\w+", dockerfile, re.MULTILINE), (
        "the image must not run as root"
    )
    assert "COPY captcha_tasks " in dockerfile  # the Celery settings travel in the package
    assert ".env" in (ROOT / ".dockerignore").read_text().split(), "secrets in the build context"


# -- environment ---------------------------------------------------------------------------


def test_every_variable_is_one_something_reads() -> None:
    unknown_in_compose = _interpolated(COMPOSE_TEXT) - KNOWN_VARIABLES
    assert not unknown_in_compose, f"compose uses unknown variables: {unknown_in_compose}"
    for name, service in SERVICES.items():
        unknown = set(service.get("environment") or {}) - KNOWN_VARIABLES
        if name in OWN_VARIABLES:  # the image's own settings (KAFKA_* broker, GF_* Grafana)
            unknown = {v for v in unknown if not v.startswith(OWN_VARIABLES[name])}
        assert not unknown, f"{name} sets unknown variables: {unknown}"
    unknown_in_example = set(_env_example()) - KNOWN_VARIABLES
    assert not unknown_in_example, f".env.example has unknown variables: {unknown_in_example}"


def test_env_example_documents_exactly_what_compose_reads() -> None:
    assert set(_env_example()) == _interpolated(COMPOSE_TEXT)


def test_each_env_example_variable_has_a_comment_and_no_secret() -> None:
    values = _env_example()
    for index, line in enumerate(ENV_EXAMPLE_LINES):
        if line.strip() and not line.startswith("#"):
            assert index and ENV_EXAMPLE_LINES[index - 1].startswith("#"), f"undocumented: {line}"
    for name in SECRETS:
        assert values[name] == "", f".env.example must not carry a value for {name}"


def test_workers_and_beat_get_every_worker_setting() -> None:
    wanted = {v for v in ENVIRONMENT_VARIABLES if v.startswith("CAPTCHAAI_")} - NOT_FOR_WORKERS
    wanted.add("REDIS_URL")
    for name in ("worker", "beat"):
        missing = wanted - set(SERVICES[name]["environment"])
        assert not missing, f"{name} does not receive {missing}"


def test_the_api_key_reaches_only_workers_and_beat() -> None:
    for name in ("flower", "metrics", "pingback", "gateway"):
        assert "CAPTCHAAI_API_KEY" not in SERVICES[name]["environment"], name
        assert not set(PROVIDER_KEY_SLOTS) & set(SERVICES[name]["environment"]), name


def test_the_gateway_reads_its_tenants_and_their_keys_alone() -> None:
    gateway = SERVICES["gateway"]
    assert gateway["environment"]["CAPTCHAAI_TENANTS"] == "${CAPTCHAAI_TENANTS:-}"
    # the keys the tenants' key_env name: a file of their own, read by no other service
    assert gateway["env_file"] == [{"path": "./gateway.env", "required": False}]
    assert [name for name, s in SERVICES.items() if "env_file" in s] == ["gateway"]
    for ignore in (".gitignore", ".dockerignore"):
        assert "gateway.env" in (ROOT / ignore).read_text().split(), ignore
    argv = _command("gateway")
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert "/health" in " ".join(gateway["healthcheck"]["test"])


def test_flower_gets_its_login_and_no_opt_out() -> None:
    env = SERVICES["flower"]["environment"]
    assert env["FLOWER_BASIC_AUTH"] == "${FLOWER_BASIC_AUTH:-}"
    # The opt-out stays the operator's decision, never hard-coded here.
    assert env["CAPTCHAAI_FLOWER_NO_AUTH"] == "${CAPTCHAAI_FLOWER_NO_AUTH:-}"


# -- topology ------------------------------------------------------------------------------


def _listens_on(service: dict[str, Any], port: int) -> bool:
    """Whether the service's command, entry point or settings name ``port``."""
    words: list[str] = []
    for key in ("command", "entrypoint"):
        value = service.get(key, [])
        words += shlex.split(value) if isinstance(value, str) else list(value)
    words += [str(v) for v in (service.get("environment") or {}).values()]
    return any(str(port) in word for word in words)


def _published(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    ports = []
    for spec in service.get("ports", []):
        ip, host, container = str(spec).split(":")
        ports.append((ip, int(host), int(container)))
    return ports


def test_published_ports_do_not_clash_and_stay_on_loopback() -> None:
    seen: dict[int, str] = {}
    for name, service in SERVICES.items():
        for ip, host, container in _published(service):
            assert ip == "127.0.0.1", f"{name} publishes on {ip}"
            assert host not in seen, f"{name} and {seen.get(host)} both publish {host}"
            seen[host] = name
            assert _listens_on(service, container), (
                f"{name} publishes {container} but does not listen there"
            )
    assert "ports" not in SERVICES["redis"], "Redis must not be published"


def test_exactly_one_beat() -> None:
    beats = [
        name
        for name in APP_SERVICES
        if _command(name)[:4] == ["celery", "-A", "captcha_tasks", "beat"]
    ]
    assert beats == ["beat"]
    assert SERVICES["beat"]["deploy"]["replicas"] == 1
    assert "scale" not in SERVICES["beat"]


def test_redis_is_durable_bounded_and_protected() -> None:
    argv = _command("redis")
    options = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert options["--appendonly"] == "yes"
    assert options["--maxmemory-policy"] == "noeviction"
    assert options["--requirepass"].startswith("${REDIS_PASSWORD:?")
    assert any(v.endswith(":/data") for v in SERVICES["redis"]["volumes"])
    redis_url = SERVICES["worker"]["environment"]["REDIS_URL"]
    # The bundled Redis unless .env names another (the `ha` profile's sentinels).
    assert redis_url.startswith("${REDIS_URL:-redis://:${REDIS_PASSWORD:?") and redis_url.endswith(
        "@redis:6379/0}"
    )


def test_every_service_has_a_health_check_and_waits_for_redis() -> None:
    for name, service in SERVICES.items():
        assert "healthcheck" in service, f"{name} has no health check"
    for name in APP_SERVICES:
        if name == "sandbox":
            continue  # talks to no Redis
        assert SERVICES[name]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_optional_services_sit_behind_profiles() -> None:
    profiled = {name: s["profiles"] for name, s in SERVICES.items() if "profiles" in s}
    assert profiled == {
        "sandbox": ["dev"],
        "kafka": ["kafka"],
        "kafka-bridge": ["kafka"],
        "pingback": ["pingback"],
        "gateway": ["gateway"],
        "prometheus": ["monitoring"],
        "grafana": ["monitoring"],
        **{name: ["ha"] for name in HA},
    }


def test_third_party_images_are_pinned() -> None:
    for name in sorted(THIRD_PARTY):
        image = SERVICES[name]["image"]
        _, sep, tag = image.rpartition(":")
        assert sep and tag and tag != "latest", f"{name}: pin a tag, not {image!r}"


def test_every_mounted_file_is_in_the_repository() -> None:
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):  # a bind mount (a bare name is a named volume)
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is missing"
            else:
                assert source in COMPOSE["volumes"], f"{name}: undeclared volume {source}"


def _grafana_guard(password: str) -> subprocess.CompletedProcess[str]:
    """Grafana's entry point, with the image's /run.sh replaced by ``true``."""
    entrypoint = SERVICES["grafana"]["entrypoint"]
    assert entrypoint[:2] == ["/bin/sh", "-c"]
    script = entrypoint[2].replace("$$", "$")  # compose's escape for a literal dollar
    assert "exec /run.sh" in script
    script = script.replace("exec /run.sh", "exec true")
    env = {"PATH": os.environ["PATH"], "GF_SECURITY_ADMIN_PASSWORD": password}
    return subprocess.run(
        ["/bin/sh", "-c", script, *entrypoint[3:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )


def test_grafana_refuses_to_start_without_an_admin_password() -> None:
    env = SERVICES["grafana"]["environment"]
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == "${GRAFANA_ADMIN_PASSWORD:-}"
    refused = _grafana_guard("")
    assert refused.returncode != 0
    assert "GRAFANA_ADMIN_PASSWORD" in refused.stderr
    assert _grafana_guard("s3cret-from-env").returncode == 0


# -- the `ha` profile ----------------------------------------------------------------------


def test_every_service_that_reaches_redis_gets_the_sentinel_settings() -> None:
    wanted = {
        "REDIS_URL",
        "REDIS_SENTINEL_MASTER",
        "REDIS_SENTINEL_PASSWORD",
        "REDIS_SENTINEL_TLS",
        "REDIS_SENTINEL_TLS_CA_FILE",
    }
    for name in APP_SERVICES:
        if name == "sandbox":
            continue  # talks to no Redis
        missing = wanted - set(SERVICES[name]["environment"])
        assert not missing, f"{name} does not receive {missing}"


def test_the_replica_follows_redis_and_both_can_swap_roles() -> None:
    for name, announced in (("redis", "redis"), ("redis-replica", "redis-replica")):
        argv = _command(name)
        options = {word: argv[i + 1] for i, word in enumerate(argv[:-1]) if word[:2] == "--"}
        assert options["--masterauth"].startswith("${REDIS_PASSWORD:?"), name
        assert options["--requirepass"] == options["--masterauth"], name
        assert options["--replica-announce-ip"] == announced, name  # a name, not an address
        assert options["--appendonly"] == "yes", name
    replica = _command("redis-replica")
    assert replica[replica.index("--replicaof") + 1 : replica.index("--replicaof") + 3] == [
        "redis",
        "6379",
    ]
    assert any(v.endswith(":/data") for v in SERVICES["redis-replica"]["volumes"])


def _sentinel_script(service: str = "sentinel-1") -> str:
    entrypoint = SERVICES[service]["entrypoint"]
    assert entrypoint[:2] == ["/bin/sh", "-c"]
    return str(entrypoint[2]).replace("$$", "$")  # compose's escape for a literal dollar


def _run_sentinel_script(data: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The sentinels' entry point writing its config under ``data``, with the server's
    start replaced by ``true``."""
    script = _sentinel_script().replace("/data/", f"{data}/")
    assert 'exec redis-server "$conf" --sentinel' in script
    script = script.replace('exec redis-server "$conf" --sentinel', "exec true")
    done = subprocess.run(
        ["/bin/sh", "-c", script],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return done, data / "sentinel.conf"


def test_sentinels_refuse_to_start_without_their_password(tmp_path: Path) -> None:
    assert all(SERVICES[name]["entrypoint"] == SERVICES["sentinel-1"]["entrypoint"]
               for name in SENTINELS)  # fmt: skip
    refused, conf = _run_sentinel_script(tmp_path, REDIS_PASSWORD="p")
    assert refused.returncode != 0
    assert "REDIS_SENTINEL_PASSWORD" in refused.stderr
    assert not conf.exists()


def test_the_sentinels_config_runs_a_real_sentinel_watching_the_master(tmp_path: Path) -> None:
    """The config the `ha` sentinels write, with `redis` and the ports moved to loopback,
    run by a real sentinel: it authenticates to the master, and wants its password."""
    password, sentinel_password = "redis-" + os.urandom(4).hex(), "sent-" + os.urandom(4).hex()
    done, conf = _run_sentinel_script(
        tmp_path, REDIS_PASSWORD=password, REDIS_SENTINEL_PASSWORD=sentinel_password
    )
    assert done.returncode == 0, done.stderr
    text = conf.read_text()
    assert "sentinel monitor captcha-tasks redis 6379 2" in text
    with RedisServer(log_dir=tmp_path, password=password) as master:
        master.start()
        port = free_port()
        conf.write_text(
            text.replace("redis 6379", f"127.0.0.1 {master.port}").replace(
                "port 26379", f"port {port}\nbind 127.0.0.1\ndir {tmp_path}"
            )
        )
        sentinel = subprocess.Popen(
            [find_redis_server(), str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            client = redis.Redis(port=port, password=sentinel_password, decode_responses=True)

            def watching() -> bool:
                try:
                    state = client.sentinel_master("captcha-tasks")
                except redis.RedisError:
                    return False
                return isinstance(state, dict) and state["flags"] == "master"  # no s_down

            wait_until(watching, 15, what="the sentinel watching the master")
            with pytest.raises(redis.AuthenticationError):
                redis.Redis(port=port).sentinel_masters()
        finally:
            sentinel.kill()
            sentinel.wait(10)


def test_the_env_example_sentinel_url_names_the_ha_sentinels() -> None:
    [line] = [line for line in ENV_EXAMPLE_LINES if line.startswith("# REDIS_URL=sentinel://")]
    url = line.removeprefix("# REDIS_URL=").replace("${REDIS_PASSWORD}", "secret")
    settings = Settings(redis=RedisSettings(url=url, sentinel_master="captcha-tasks"))
    assert settings.redis.sentinel is not None
    assert settings.redis.sentinel.sentinels == tuple((name, 26379) for name in SENTINELS)
    assert settings.redis.sentinel.password == "secret"
    assert "captcha-tasks" in _sentinel_script()  # the name the sentinels watch by default

from __future__ import annotations

from dataclasses import fields
from ipaddress import ip_network
from pathlib import Path

import pytest

from captcha_tasks.errors import ConfigurationError
from captcha_tasks.settings import (
    DEFAULT_BASE_URL,
    ENVIRONMENT_VARIABLES,
    Settings,
    documented,
    mask_url,
)

pytestmark = pytest.mark.unit


def test_defaults() -> None:
    s = Settings.from_env({})
    assert s.providers.base_url == DEFAULT_BASE_URL
    assert s.solving.poll_interval == 5.0
    assert s.solving.solve_timeout == 300.0
    assert s.solving.initial_wait is None


def test_reads_environment() -> None:
    s = Settings.from_env(
        {
            "CAPTCHAAI_API_KEY": "k",
            "CAPTCHAAI_THREADS": "15",
            "CAPTCHAAI_POLL_INTERVAL": "0.5",
            "CAPTCHAAI_INITIAL_WAIT": "1",
            "CAPTCHAAI_TOKEN_LIFETIMES": '{"turnstile": 60}',
            "CAPTCHAAI_BASE_URL": "http://127.0.0.1:9/",
        }
    )
    assert (s.providers.threads, s.solving.poll_interval, s.solving.initial_wait) == (15, 0.5, 1.0)
    assert s.solving.token_lifetimes == {"turnstile": 60.0}
    assert s.providers.base_url == "http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("CAPTCHAAI_THREADS", "many"),
        ("CAPTCHAAI_THREADS", "0"),
        ("CAPTCHAAI_POLL_INTERVAL", "-1"),
        ("CAPTCHAAI_SOLVE_TIMEOUT", "0"),
        ("CAPTCHAAI_BASE_URL", "ocr.captchaai.com"),
        ("REDIS_URL", "http://localhost:6379"),
        ("CAPTCHAAI_TOKEN_LIFETIMES", "[1, 2]"),
        ("CAPTCHAAI_TOKEN_LIFETIMES", '{"turnstile": -5}'),
        ("CAPTCHAAI_VISIBILITY_TIMEOUT", "30"),  # not longer than the HTTP timeouts (35 s)
        ("CAPTCHAAI_QUEUE_PREFIX", "two words"),
        ("CAPTCHAAI_PINGBACK_ALLOW", "10.0.0.0/33"),
        ("CAPTCHAAI_PINGBACK_TRUSTED_PROXIES", "10.0.0.1, proxy.internal"),
        ("CAPTCHAAI_SOFT_ID", "my-app"),
        ("CAPTCHAAI_SOFT_ID", "1" * 21),
    ],
)
def test_bad_values_name_the_variable(var: str, value: str) -> None:
    assert var in ENVIRONMENT_VARIABLES
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({var: value})
    assert var in str(info.value)


def test_a_soft_id_is_read_as_given() -> None:
    assert Settings.from_env({}).providers.soft_id is None
    assert Settings.from_env({"CAPTCHAAI_SOFT_ID": " 4580 "}).providers.soft_id == "4580"


def test_secrets_not_in_repr() -> None:
    s = Settings.from_env(
        {"CAPTCHAAI_API_KEY": "supersecret123", "REDIS_URL": "redis://:hunter2@h:6379/0"}
    )
    assert "supersecret123" not in repr(s)
    assert "hunter2" not in repr(s)


def test_every_setting_has_its_own_environment_variable() -> None:
    docs = documented()
    assert len(ENVIRONMENT_VARIABLES) == len(docs)  # no variable read twice
    defaults = Settings()
    for concern in fields(defaults):
        for f in fields(getattr(defaults, concern.name)):
            assert f.metadata["env"] in ENVIRONMENT_VARIABLES, f"{concern.name}.{f.name}"


def test_every_setting_documents_its_variable_default_type_and_meaning() -> None:
    docs = documented()
    assert {doc.variable for doc in docs} == ENVIRONMENT_VARIABLES
    defaults = Settings()
    for doc in docs:
        concern, name = doc.path.split(".")
        assert doc.meaning.strip() and doc.type, doc.variable
        assert doc.default == getattr(getattr(defaults, concern), name), doc.variable


def test_the_environment_is_read_in_one_place() -> None:
    # Every concern is read by the one builder, each field from its own variable.
    env = {
        "CAPTCHAAI_PINGBACK_FALLBACK_POLL": "2.5",
        "KAFKA_GROUP_ID": "g",
        "REDIS_URL": "redis://h/1",
    }
    s = Settings.from_env(env)
    assert (s.pingback.fallback_poll, s.kafka.group_id, s.redis.url) == (2.5, "g", "redis://h/1")
    assert s.replace(kafka={"group_id": "h"}).kafka.group_id == "h"
    assert s.replace(kafka={"group_id": "h"}).redis == s.redis


# -- Redis behind Sentinel -----------------------------------------------------------------

SENTINELS = "sentinel://:p%40ss@10.0.0.1:26379/2;sentinel://10.0.0.2:26380/2;sentinel://10.0.0.3"


def test_a_sentinel_url_is_parsed_once_into_one_value(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    s = Settings.from_env(
        {
            "REDIS_URL": SENTINELS,
            "REDIS_SENTINEL_MASTER": "main",
            "REDIS_SENTINEL_PASSWORD": "sentinel-secret",
            "REDIS_SENTINEL_TLS": "1",
            "REDIS_SENTINEL_TLS_CA_FILE": str(ca),
        }
    )
    where = s.redis.sentinel
    assert where is not None and where is s.redis.sentinel  # parsed once
    assert where.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("10.0.0.3", 26379))
    assert (where.master, where.db, where.password) == ("main", 2, "p@ss")
    assert where.sentinel_password == "sentinel-secret"
    assert (where.tls, where.tls_ca_file) == (True, str(ca))
    shown = repr(s) + repr(where)
    assert "p@ss" not in shown and "p%40ss" not in shown and "sentinel-secret" not in shown


def test_a_plain_url_has_no_sentinels() -> None:
    assert Settings.from_env({"REDIS_URL": "redis://h:6379/0"}).redis.sentinel is None


def _sentinel_env(url: str, **extra: str) -> dict[str, str]:
    return {"REDIS_URL": url, "REDIS_SENTINEL_MASTER": "m", **extra}


@pytest.mark.parametrize(
    ("env", "var"),
    [
        ({"REDIS_URL": "sentinel://h:26379"}, "REDIS_SENTINEL_MASTER"),
        (_sentinel_env("sentinel://h", REDIS_SENTINEL_MASTER="a b"), "REDIS_SENTINEL_MASTER"),
        ({"REDIS_SENTINEL_MASTER": "main"}, "REDIS_SENTINEL_MASTER"),
        ({"REDIS_SENTINEL_PASSWORD": "x"}, "REDIS_SENTINEL_PASSWORD"),
        ({"REDIS_SENTINEL_TLS": "1"}, "REDIS_SENTINEL_TLS"),
        (_sentinel_env("sentinel://h;redis://h2:6379"), "REDIS_URL"),
        (_sentinel_env("sentinel://:a@h1;sentinel://:b@h2"), "REDIS_URL"),
        (_sentinel_env("sentinel://h1/1;sentinel://h2/2"), "REDIS_URL"),
        (_sentinel_env("sentinel://h1/zero"), "REDIS_URL"),
        (_sentinel_env("sentinel://h1:port"), "REDIS_URL"),
        (_sentinel_env("sentinel://h1?ssl=1"), "REDIS_URL"),
        (_sentinel_env("sentinel://user:pw@h1"), "REDIS_URL"),
        (_sentinel_env("sentinel://"), "REDIS_URL"),
        (_sentinel_env("sentinel://h", REDIS_SENTINEL_TLS="maybe"), "REDIS_SENTINEL_TLS"),
        (
            _sentinel_env("sentinel://h", REDIS_SENTINEL_TLS_CA_FILE="/etc/hosts"),
            "REDIS_SENTINEL_TLS_CA_FILE",
        ),
        (
            _sentinel_env(
                "sentinel://h", REDIS_SENTINEL_TLS="1", REDIS_SENTINEL_TLS_CA_FILE="/no/ca.pem"
            ),
            "REDIS_SENTINEL_TLS_CA_FILE",
        ),
    ],
)
def test_a_bad_sentinel_combination_is_one_line_naming_the_variable(
    env: dict[str, str], var: str
) -> None:
    assert var in ENVIRONMENT_VARIABLES
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env(env)
    message = str(info.value)
    assert message.split(":", 1)[1].split()[0] == var, message  # the variable comes first
    assert "\n" not in message
    assert "pw" not in message and ":a@" not in message  # no password echoed


def test_mask_url_masks_every_sentinel_part() -> None:
    masked = mask_url("sentinel://:one@h1:26379/0;sentinel://:one@h2:26379/0")
    assert masked == "sentinel://:***@h1:26379/0;sentinel://:***@h2:26379/0"


def test_pingback_networks() -> None:
    s = Settings.from_env(
        {
            "CAPTCHAAI_PINGBACK_ALLOW": "203.0.113.0/24, 198.51.100.7 2001:db8::/32",
            "CAPTCHAAI_PINGBACK_TRUSTED_PROXIES": "10.1.2.3/8",
        }
    )
    assert s.pingback.allow == (
        ip_network("203.0.113.0/24"),
        ip_network("198.51.100.7/32"),
        ip_network("2001:db8::/32"),
    )
    assert s.pingback.trusted_proxies == (ip_network("10.0.0.0/8"),)
    assert Settings.from_env({}).pingback.allow == ()


@pytest.mark.parametrize("var", ["CAPTCHAAI_PINGBACK_ALLOW", "CAPTCHAAI_PINGBACK_TRUSTED_PROXIES"])
def test_a_bad_network_is_one_line_naming_it(var: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({var: "203.0.113.0/24,203.0.113.300"})
    message = str(info.value)
    assert f"{var} has an invalid value: '203.0.113.300' is not an address" in message
    assert "\n" not in message
    with pytest.raises(ConfigurationError, match=var):
        field = var.lower().removeprefix("captchaai_pingback_")
        Settings().replace(pingback={field: ("10.0.0.0/8",)})


def providers_env(entries: str, **more: str) -> dict[str, str]:
    return {"CAPTCHAAI_PROVIDERS": entries, "BACKUP_KEY": "backup-secret", **more}


BACKUP = (
    '{"name": "backup", "base_url": "https://b.example/", "key_env": "BACKUP_KEY", "threads": 7'
)


def test_further_providers_read_their_key_from_the_variable_they_name() -> None:
    s = Settings.from_env(
        providers_env(f'[{BACKUP}, "methods": ["turnstile"], "role": "overflow"}}]')
    )
    primary, backup = s.providers.all
    assert (primary.name, primary.role, primary.kind) == ("captchaai", "primary", "captchaai")
    assert (backup.name, backup.role, backup.kind, backup.threads) == (
        "backup",
        "overflow",
        "2captcha",
        7,
    )
    assert backup.base_url == "https://b.example" and backup.api_key == "backup-secret"
    assert backup.supports("turnstile") and not backup.supports("userrecaptcha")
    assert "backup-secret" not in repr(s) and "backup-secret" not in repr(backup)


def test_budgets_belong_to_the_kind_and_can_be_overridden() -> None:
    s = Settings.from_env(providers_env(f'[{BACKUP}, "submit_rate": null, "res_base": 50}}]'))
    primary, backup = s.providers.all
    assert primary.budgets.submit_rate is None  # CaptchaAI sells threads: no in.php cap
    assert primary.budgets.res_per_captcha is None
    assert backup.budgets.submit_rate is None and backup.budgets.res_base == 50
    assert backup.budgets.no_slot_ratio == 3.0 and backup.budgets.res_per_captcha == 20
    twocaptcha = Settings.from_env({"CAPTCHAAI_PROVIDER_KIND": "2captcha"}).providers.primary
    assert twocaptcha.budgets.submit_rate == 60
    assert (
        Settings.from_env({"CAPTCHAAI_SUBMIT_RATE": "120"}).providers.primary.budgets.submit_rate
        == 120
    )
    assert (
        Settings.from_env(
            {"CAPTCHAAI_BUDGETS": '{"submit_rate": 5}'}
        ).providers.primary.budgets.submit_rate
        == 5
    )


def test_the_json_kinds_are_providers_of_their_protocol() -> None:
    entries = ",".join(
        BACKUP.replace('"backup"', f'"{kind}"')
        .replace("https://b.example/", f"https://api.{kind}.example")
        .replace('"threads": 7', f'"threads": 7, "kind": "{kind}"')
        + "}"
        for kind in ("anticaptcha", "capsolver", "capmonster")
    )
    s = Settings.from_env(providers_env(f"[{entries}]"))
    _, *json_kinds = s.providers.all
    assert [(p.kind, p.protocol) for p in json_kinds] == [
        ("anticaptcha", "json"),
        ("capsolver", "json"),
        ("capmonster", "json"),
    ]
    assert s.providers.primary.protocol == "in.php"
    assert json_kinds[0].base_url == "https://api.anticaptcha.example"
    assert json_kinds[0].describe()["protocol"] == "json"
    # the JSON family's budgets are per task (the dialect's): no account budget
    assert all(p.budgets.submit_rate is None for p in json_kinds)
    # a dialect without a method's task type does not take it (no CaptchaFox)
    assert all(not p.supports("captchafox") for p in json_kinds)
    assert all(p.supports("userrecaptcha") and p.supports("base64") for p in json_kinds)
    assert s.providers.primary.supports("captchafox")


def test_the_primary_may_be_of_a_json_kind() -> None:
    s = Settings.from_env(
        {"CAPTCHAAI_PROVIDER_KIND": "CapSolver", "CAPTCHAAI_BASE_URL": "https://api.capsolver.com"}
    )
    assert (s.providers.primary.kind, s.providers.primary.protocol) == ("capsolver", "json")
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({"CAPTCHAAI_PROVIDER_KIND": "capsolva"})
    assert info.value.message.startswith("CAPTCHAAI_PROVIDER_KIND is 'capsolva', not one of")
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env(
            {
                "CAPTCHAAI_PROVIDER_KIND": "capmonster",
                "CAPTCHAAI_BASE_URL": "https://api.capmonster.cloud/getTaskResult/",
            }
        )
    assert info.value.message.startswith(
        "CAPTCHAAI_BASE_URL must be the API root, without the endpoint /getTaskResult"
    )


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        ("{}", "must be a JSON list"),
        (f'[{BACKUP}, "colour": "red"}}]', "unknown field 'colour'"),
        (f"[{BACKUP}}}, {BACKUP}}}]", "provider name 'backup' is used twice"),
        (f'[{BACKUP}, "methods": ["turnstyle"]}}]', "unknown method 'turnstyle'"),
        ("[" + BACKUP.replace('"backup"', '"captchaai"') + "}]", "the primary's name"),
        (f'[{BACKUP}, "threads": 0}}]', "threads must be a whole number >= 1"),
        (f'[{BACKUP}, "kind": "anticaptha"}}]', "kind 'anticaptha' is not one of captchaai,"),
        (f'[{BACKUP}, "kind": 3}}]', "kind must be one of"),
        (
            "["
            + BACKUP.replace("https://b.example/", "https://api.anti-captcha.com/createTask")
            + ', "kind": "anticaptcha"}]',
            "base_url must be the API root, without the endpoint /createTask",
        ),
        (
            "[" + BACKUP.replace("https://b.example/", "https://b.example/in.php") + "}]",
            "base_url must be the API root, without the endpoint /in.php",
        ),
        ("[" + BACKUP.replace("https://b.example/", "https://b.example/?k=1") + "}]", "query"),
        (f'[{BACKUP}, "submit_rate": "fast"}}]', "submit_rate must be a number"),
        ("[" + BACKUP.replace("https://b.example/", "ftp://b") + "}]", "base_url must be"),
    ],
)
def test_a_bad_provider_list_is_one_line_naming_the_entry_and_field(
    entries: str, says: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env(providers_env(entries))
    assert info.value.message.startswith("CAPTCHAAI_PROVIDERS")
    assert says in info.value.message
    assert "\n" not in info.value.message and "backup-secret" not in info.value.message

from __future__ import annotations

from ipaddress import ip_network

import pytest

from captcha_tasks.errors import ConfigurationError
from captcha_tasks.settings import DEFAULT_BASE_URL, ENVIRONMENT_VARIABLES, Settings


def test_defaults() -> None:
    s = Settings.from_env({})
    assert s.base_url == DEFAULT_BASE_URL
    assert s.poll_interval == 5.0
    assert s.solve_timeout == 300.0
    assert s.initial_wait is None


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
    assert (s.threads, s.poll_interval, s.initial_wait) == (15, 0.5, 1.0)
    assert s.token_lifetimes == {"turnstile": 60.0}
    assert s.base_url == "http://127.0.0.1:9"


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
    ],
)
def test_bad_values_name_the_variable(var: str, value: str) -> None:
    assert var in ENVIRONMENT_VARIABLES
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({var: value})
    assert var in str(info.value)


def test_secrets_not_in_repr() -> None:
    s = Settings.from_env(
        {"CAPTCHAAI_API_KEY": "supersecret123", "REDIS_URL": "redis://:hunter2@h:6379/0"}
    )
    assert "supersecret123" not in repr(s)
    assert "hunter2" not in repr(s)


def test_every_setting_has_its_environment_variable() -> None:
    from dataclasses import fields

    from captcha_tasks.settings import _ENV

    assert {f.name for f in fields(Settings)} == set(_ENV)
    assert len(ENVIRONMENT_VARIABLES) == len(_ENV)


def test_pingback_networks() -> None:
    s = Settings.from_env(
        {
            "CAPTCHAAI_PINGBACK_ALLOW": "203.0.113.0/24, 198.51.100.7 2001:db8::/32",
            "CAPTCHAAI_PINGBACK_TRUSTED_PROXIES": "10.1.2.3/8",
        }
    )
    assert s.pingback_allow == (
        ip_network("203.0.113.0/24"),
        ip_network("198.51.100.7/32"),
        ip_network("2001:db8::/32"),
    )
    assert s.pingback_trusted_proxies == (ip_network("10.0.0.0/8"),)
    assert Settings.from_env({}).pingback_allow == ()


@pytest.mark.parametrize("var", ["CAPTCHAAI_PINGBACK_ALLOW", "CAPTCHAAI_PINGBACK_TRUSTED_PROXIES"])
def test_a_bad_network_is_one_line_naming_it(var: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({var: "203.0.113.0/24,203.0.113.300"})
    message = str(info.value)
    assert f"{var} has an invalid value: '203.0.113.300' is not an address" in message
    assert "\n" not in message
    with pytest.raises(ConfigurationError, match=var):
        Settings().replace(**{var.lower().removeprefix("captchaai_"): ("10.0.0.0/8",)})

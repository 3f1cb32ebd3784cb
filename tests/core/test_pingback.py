"""Pingback tickets and settings: pure functions, no I/O."""

from __future__ import annotations

import pytest

from captcha_tasks.core import pingback
from captcha_tasks.errors import ConfigurationError
from captcha_tasks.settings import Settings

pytestmark = pytest.mark.unit

SECRET = "s3cret-of-sixteen-chars"


def test_ticket_round_trip_names_the_attempt() -> None:
    url = pingback.callback_url("https://hooks.example.com/cb/", SECRET, "solve-1", 2)
    base, _, segment = url.rpartition("/")
    assert base == "https://hooks.example.com/cb"
    assert pingback.read_ticket(SECRET, segment) == pingback.Ticket("solve-1", 2)


@pytest.mark.parametrize(
    "change",
    [
        lambda seg: seg.replace("solve-1", "solve-2", 1),  # another solve, same MAC
        lambda seg: seg.replace(".2.", ".3.", 1),  # another attempt
        lambda seg: seg[:-1] + ("0" if seg[-1] != "0" else "1"),  # one MAC digit off
    ],
)
def test_a_ticket_speaks_for_its_own_attempt_only(change: object) -> None:
    segment = pingback.ticket(SECRET, "solve-1", 2)
    with pytest.raises(pingback.BadMac):
        pingback.read_ticket(SECRET, change(segment))  # type: ignore[operator]


def test_another_secret_fails_the_mac() -> None:
    segment = pingback.ticket(SECRET, "solve-1", 0)
    with pytest.raises(pingback.BadMac):
        pingback.read_ticket("another-secret-of-16", segment)


@pytest.mark.parametrize(
    "segment", ["", "solve-1", "solve-1.x.abc", "a b.0." + "0" * 32, "s.٣." + "0" * 32]
)
def test_malformed_paths_are_not_tickets(segment: str) -> None:
    with pytest.raises(pingback.BadTicket) as info:
        pingback.read_ticket(SECRET, segment)
    assert not isinstance(info.value, pingback.BadMac)


def test_the_url_needs_a_secret() -> None:
    with pytest.raises(ConfigurationError, match="CAPTCHAAI_PINGBACK_SECRET"):
        Settings.from_env({"CAPTCHAAI_PINGBACK_URL": "https://hooks.example.com/cb"})
    with pytest.raises(ConfigurationError, match="CAPTCHAAI_PINGBACK_SECRET"):
        Settings.from_env(
            {"CAPTCHAAI_PINGBACK_URL": "https://h.example/cb", "CAPTCHAAI_PINGBACK_SECRET": "short"}
        )


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("CAPTCHAAI_PINGBACK_URL", "ftp://hooks.example.com/cb"),
        ("CAPTCHAAI_PINGBACK_URL", "https://hooks.example.com/cb?x=1"),
        ("CAPTCHAAI_PINGBACK_FALLBACK_POLL", "0"),
    ],
)
def test_bad_pingback_settings_name_the_variable(var: str, value: str) -> None:
    env = {
        "CAPTCHAAI_PINGBACK_URL": "https://hooks.example.com/cb",
        "CAPTCHAAI_PINGBACK_SECRET": SECRET,
        var: value,
    }
    with pytest.raises(ConfigurationError, match=var):
        Settings.from_env(env)


def test_settings_with_callbacks_on() -> None:
    settings = Settings.from_env(
        {
            "CAPTCHAAI_PINGBACK_URL": "https://hooks.example.com/cb/",
            "CAPTCHAAI_PINGBACK_SECRET": SECRET,
        }
    )
    assert settings.pingback.enabled and settings.pingback.url == "https://hooks.example.com/cb"
    assert SECRET not in repr(settings)
    assert not Settings.from_env({}).pingback.enabled


def test_a_ticket_names_its_provider_and_speaks_for_it_alone() -> None:
    segment = pingback.ticket(SECRET, "solve-1", 0, "backup")
    assert pingback.read_ticket(SECRET, segment) == pingback.Ticket("solve-1", 0, "backup")
    # the same captcha id at another provider: the MAC covers the provider's name
    moved = segment.replace(".backup.", ".other.")
    with pytest.raises(pingback.BadMac):
        pingback.read_ticket(SECRET, moved)
    # the primary's tickets keep the shape of a deployment with one provider
    primary = pingback.ticket(SECRET, "solve-1", 0)
    assert primary.count(".") == 2
    with pytest.raises(pingback.BadMac):
        pingback.read_ticket(SECRET, primary.replace("solve-1.0.", "solve-1.0.backup.", 1))

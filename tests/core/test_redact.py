from __future__ import annotations

import ast
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from image_files import png_b64
from parsing import parse

from captcha_tasks.settings import Settings, reset_settings
from captcha_tasks.worker.redact import RedactingFilter, mask_params, redact_text, secrets_of

pytestmark = pytest.mark.unit


def test_images_are_never_shown() -> None:
    images = [png_b64() for _ in range(9)]
    shown = mask_params({"method": "bls", "images": images, "instructions": "cars"})
    assert shown == {"method": "bls", "images": "<9 images>", "instructions": "cars"}
    body = png_b64()
    assert mask_params({"body": body})["body"] == f"<image, {len(body)} base64 chars>"


SECRET_ENV = {
    "CAPTCHAAI_API_KEY": "primary-key-1111",
    "CAPTCHAAI_PROVIDERS": json.dumps(
        [
            {
                "name": "backup",
                "base_url": "https://2captcha.example",
                "key_env": "BACKUP_KEY",
                "threads": 5,
            }
        ]
    ),
    "BACKUP_KEY": "backup-key-2222",
    "CAPTCHAAI_TENANTS": json.dumps({"shop": {"key_env": "SHOP_GATEWAY_KEY"}}),
    "SHOP_GATEWAY_KEY": "shop-gateway-key-3333",
}


def test_every_providers_and_tenants_key_is_a_secret() -> None:
    settings = Settings.from_env(SECRET_ENV)
    found = secrets_of(settings, SECRET_ENV)
    assert set(found) == {"primary-key-1111", "backup-key-2222", "shop-gateway-key-3333"}
    assert [len(s) for s in found] == sorted((len(s) for s in found), reverse=True)


def test_log_lines_lose_every_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRET_ENV.items():
        monkeypatch.setenv(name, value)
    reset_settings()
    try:
        line = (
            "in.php?key=x backup-key-2222 refused; tenant shop-gateway-key-3333; primary-key-1111"
        )
        record = logging.LogRecord("t", logging.WARNING, __file__, 1, line, None, None)
        assert RedactingFilter(lambda: Settings.from_env(SECRET_ENV)).filter(record)
        assert record.getMessage() == "in.php?key=*** *** refused; tenant ***; ***"
        assert redact_text("nothing secret here") == "nothing secret here"
    finally:
        reset_settings()


def test_a_process_of_ours_logs_through_the_redacting_filter() -> None:
    """``configure_logging`` (the gateway's, the receiver's, the bridge's and the exporter's
    logging) redacts every line of the process: run in a process of its own, as they are."""
    key = "provider-key-" + "7" * 20
    code = (
        "import logging\n"
        "from captcha_tasks.settings import Settings\n"
        "from captcha_tasks.worker.redact import configure_logging\n"
        f"settings = Settings.from_env({{'CAPTCHAAI_API_KEY': {key!r}}})\n"
        "configure_logging('INFO', lambda: settings)\n"
        f"logging.getLogger('captcha_tasks.gateway').warning('refused %s', {key!r})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "refused ***" in done.stderr, done.stderr
    assert key not in done.stderr


def test_no_process_of_ours_configures_logging_around_the_filter() -> None:
    """Every process of ours that sets up its own logging does it through
    ``configure_logging``: nothing else in the package calls ``logging.basicConfig``."""
    root = Path(__file__).resolve().parents[2] / "captcha_tasks"
    callers = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "basicConfig":
                callers.append(str(path.relative_to(root)))
    assert callers == ["worker/redact.py"]

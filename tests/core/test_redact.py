from __future__ import annotations

import pytest
from image_files import png_b64

from captcha_tasks.worker.redact import mask_params

pytestmark = pytest.mark.unit


def test_images_are_never_shown() -> None:
    images = [png_b64() for _ in range(9)]
    shown = mask_params({"method": "bls", "images": images, "instructions": "cars"})
    assert shown == {"method": "bls", "images": "<9 images>", "instructions": "cars"}
    body = png_b64()
    assert mask_params({"body": body})["body"] == f"<image, {len(body)} base64 chars>"

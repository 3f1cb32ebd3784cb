"""Real image files of a chosen size for image captcha tests (no image library needed)."""

from __future__ import annotations

import base64
import os
import struct
import zlib

_SIDE = 16


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def png(size: int = 4096) -> bytes:
    """A valid 16x16 PNG of random pixels, padded with a comment to exactly ``size`` bytes."""
    rows = b"".join(b"\x00" + os.urandom(3 * _SIDE) for _ in range(_SIDE))
    head = b"\x89PNG\r\n\x1a\n" + _chunk(
        b"IHDR", struct.pack(">IIBBBBB", _SIDE, _SIDE, 8, 2, 0, 0, 0)
    )
    body = _chunk(b"IDAT", zlib.compress(rows))
    end = _chunk(b"IEND", b"")
    filler = size - len(head) - len(body) - len(end) - 12 - len(b"Comment\x00")
    if filler < 0:
        raise ValueError(f"a PNG needs at least {size - filler} bytes")
    comment = _chunk(b"tEXt", b"Comment\x00" + b"x" * filler)
    return head + body + comment + end


def png_b64(size: int = 4096) -> str:
    return base64.b64encode(png(size)).decode("ascii")

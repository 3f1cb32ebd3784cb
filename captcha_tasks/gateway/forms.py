"""A request's fields: the query's and the body's (a form, ``multipart/form-data`` with file
parts, or a JSON object), read from a body the server core has already capped in size
(:data:`~captcha_tasks.gateway.site.MAX_BODY`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any
from urllib.parse import parse_qsl

from ..serving import Request

#: Parts a multipart body may have (a BLS captcha has nine images and a few fields).
MAX_PARTS = 64


class Unreadable(ValueError):
    """A body that is not what its content type says (the message says what is wrong)."""


@dataclass(frozen=True)
class Fields:
    """Text fields (the body's win over the query's) and file parts (bytes)."""

    text: dict[str, str]
    files: dict[str, bytes] = field(default_factory=dict)


def _content_type(request: Request) -> str:
    return (request.header("content-type") or "").split(";")[0].strip().lower()


def read_fields(request: Request) -> Fields:
    """The fields of an ``in.php`` / ``res.php`` request; :class:`Unreadable` for a body
    that cannot be read."""
    text = dict(parse_qsl(request.query, keep_blank_values=True))
    files: dict[str, bytes] = {}
    kind = _content_type(request)
    if not request.body:
        return Fields(text)
    if kind == "multipart/form-data":
        parts, files = _multipart(request)
        text.update(parts)
    elif kind in ("", "application/x-www-form-urlencoded", "text/plain"):
        body = _decoded(request.body)
        text.update(parse_qsl(body, keep_blank_values=True))
    elif kind == "application/json":
        text.update({k: _scalar_text(v) for k, v in read_json(request).items()})
    else:
        raise Unreadable(f"a body of type {kind[:60]!r} cannot be read (send a form)")
    return Fields(text, files)


def read_json(request: Request) -> dict[str, Any]:
    """A JSON object body; :class:`Unreadable` for anything else."""
    try:
        data = json.loads(_decoded(request.body or b"{}"))
    except ValueError:
        raise Unreadable("the body is not JSON") from None
    if not isinstance(data, dict):
        raise Unreadable("the body must be a JSON object")
    return data


def _decoded(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable("the body is not UTF-8 text") from None


def _scalar_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _multipart(request: Request) -> tuple[dict[str, str], dict[str, bytes]]:
    header = request.header("content-type") or ""
    head = f"Content-Type: {header}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = BytesParser(policy=HTTP).parsebytes(head + request.body)
    if not message.is_multipart():
        raise Unreadable("the multipart body has no parts (or no boundary)")
    text: dict[str, str] = {}
    files: dict[str, bytes] = {}
    payload = message.get_payload()
    if not isinstance(payload, list) or len(payload) > MAX_PARTS:
        raise Unreadable(f"a multipart body has 1 to {MAX_PARTS} parts")
    for part in payload:
        if not isinstance(part, Message):
            continue
        name, filename = _disposition(part)
        if name is None:
            continue
        data = part.get_payload(decode=True)
        raw = data if isinstance(data, bytes) else b""
        if filename is not None:
            files[name] = raw
        else:
            text[name] = _decoded(raw)
    return text, files


def _disposition(part: Message) -> tuple[str | None, str | None]:
    name = part.get_param("name", header="content-disposition")
    filename = part.get_param("filename", header="content-disposition")
    return (
        name if isinstance(name, str) else None,
        filename if isinstance(filename, str) else None,
    )

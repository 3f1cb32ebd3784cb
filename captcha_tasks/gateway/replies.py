"""What a face of the gateway answers: the HTTP response, and the error code it carries
(for the gateway's counters; None for a success)."""

from __future__ import annotations

from dataclasses import dataclass

from ..serving import Response


@dataclass(frozen=True)
class Reply:
    response: Response
    error: str | None = None

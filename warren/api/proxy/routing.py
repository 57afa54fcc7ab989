"""Which sandbox port a request is for: ``E2b-Sandbox-Id``/``-Port`` headers or ``<port>-<id>.<domain>``."""

from __future__ import annotations

import re
from dataclasses import dataclass

ENVD_PORT = 49983
_HOST_RE = re.compile(r"^(?P<port>\d{1,5})-(?P<id>[a-z0-9]+)\.(?P<domain>[^:]+(?::\d+)?)$")


@dataclass(frozen=True)
class Target:
    sandbox_id: str
    port: int


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def target_of(headers: list[tuple[bytes, bytes]], domain: str | None) -> Target | None:
    """The proxy target of a request, or None when the request is for the control plane."""
    sandbox_id = _header(headers, b"e2b-sandbox-id")
    if sandbox_id:
        raw_port = _header(headers, b"e2b-sandbox-port")
        try:
            port = int(raw_port) if raw_port else ENVD_PORT
        except ValueError:
            port = -1
        return Target(sandbox_id.strip(), port)
    host = _header(headers, b"host")
    if host:
        match = _HOST_RE.match(host.strip().lower())
        if match and (domain is None or match["domain"] == domain.lower()):
            return Target(match["id"], int(match["port"]))
    return None

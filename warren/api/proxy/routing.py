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
        if match and (domain is None or _same_domain(match["domain"], domain.lower())):
            return Target(match["id"], int(match["port"]))
    return None


def _same_domain(given: str, domain: str) -> bool:
    """``given`` (from Host) names ``domain``: equal, or equal once the port one of them leaves out is
    dropped (a client on 443 sends no port; a node given ``D:8443`` is also reached as ``D`` behind a
    reverse proxy)."""
    if given == domain:
        return True
    return given.rpartition(":")[0] == domain or domain.rpartition(":")[0] == given

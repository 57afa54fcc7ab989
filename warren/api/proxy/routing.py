"""Which sandbox port a request is for: ``E2b-Sandbox-Id``/``-Port`` headers or ``<port>-<id>.<domain>``."""

from __future__ import annotations

import re
from collections.abc import Callable
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


def _control_plane(path: str) -> bool:
    """E2B control-plane paths; envd has none of them."""
    return path in ("/sandboxes", "/v2/sandboxes") or path.startswith(("/sandboxes/", "/v2/sandboxes/"))


def target_of(headers: list[tuple[bytes, bytes]], domain: str | None, path: str = "") -> Target | None:
    """The proxy target of a request, or None when the request is for the control plane.

    E2B SDKs before 2.9 send the envd headers on ``POST /sandboxes/{id}/connect`` too; E2B's API host
    ignores them, so a control-plane path headed for envd's port stays on the control plane."""
    sandbox_id = _header(headers, b"e2b-sandbox-id")
    if sandbox_id:
        raw_port = _header(headers, b"e2b-sandbox-port")
        try:
            port = int(raw_port) if raw_port else ENVD_PORT
        except ValueError:
            port = -1
        if port == ENVD_PORT and _control_plane(path):
            return None
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


_ENVD_PREFIXES = ("/process.Process/", "/filesystem.Filesystem/")


def envd_token_target(
    headers: list[tuple[bytes, bytes]], path: str, holder: Callable[[str], str | None]
) -> Target | None:
    """envd's port of the sandbox whose access token an envd call carries, when nothing else names one.

    E2B SDKs before 2.9 send envd calls of a ``Sandbox.connect``-ed sandbox to ``E2B_SANDBOX_URL``
    without ``E2b-Sandbox-Id`` (only ``X-Access-Token``); the token names its sandbox. Only envd's
    RPC and ``/files`` paths are taken this way, and only with a token some sandbox holds."""
    if not (path.startswith(_ENVD_PREFIXES) or path == "/files"):
        return None
    token = _header(headers, b"x-access-token")
    sandbox_id = holder(token.strip()) if token else None
    return Target(sandbox_id, ENVD_PORT) if sandbox_id else None

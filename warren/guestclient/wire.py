"""The guest agent's two set-up calls on raw sockets: ``GET /health`` until it answers, ``POST /init``.

They sit on every create, resume and claim, so they skip an HTTP client's set-up: one request, an
answer without a body, and the host closes first with a reset. :class:`warren.guestclient.AgentClient`
uses them too; this is the only implementation of either call."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import Mapping

from warren.errors import RuntimeFailure

_HEALTH_REQUEST = b"GET /health HTTP/1.1\r\nHost: agent\r\n\r\n"
RESET_ON_CLOSE = struct.pack("ii", 1, 0)
"""SO_LINGER on, 0 s: the host closes with a reset. A connection the agent closed first would sit in
TIME_WAIT inside gVisor's netstack for 60 s and make the next checkpoint fail (guest-agent-notes B3)."""
_POLL_INTERVAL_S = 0.003
"""Between connection attempts while the agent starts: runc agents answer after ~70 ms."""


async def _exchange(address: str, port: int, request: bytes) -> bytes:
    """One request whose answer has no body (204); the host closes the connection first, with a reset."""
    reader, writer = await asyncio.open_connection(address, port)
    try:
        writer.write(request)
        await writer.drain()
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        return exc.partial
    finally:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
        writer.close()


def _status(response: bytes) -> int:
    try:
        return int(response.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


async def wait_healthy(address: str, port: int, deadline: float) -> None:
    """Poll ``GET /health`` until it answers 2xx; ``deadline`` is ``time.monotonic()`` based."""
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            async with asyncio.timeout(max(0.05, min(1.0, deadline - time.monotonic()))):
                if 200 <= _status(await _exchange(address, port, _HEALTH_REQUEST)) < 300:
                    return
        except (OSError, TimeoutError) as exc:
            last = exc
        await asyncio.sleep(_POLL_INTERVAL_S)
    raise RuntimeFailure(f"the guest agent at {address}:{port} did not answer in time ({last})")


async def init_agent(
    address: str,
    port: int,
    *,
    env_vars: Mapping[str, str],
    access_token: str | None,
    default_user: str | None,
    default_workdir: str | None,
    previous_token: str | None = None,
) -> None:
    """``POST /init``: env vars, access token, default user and workdir. ``previous_token``: the token
    the agent holds now, if any (it refuses a re-init without it)."""
    body: dict[str, object] = {"envVars": dict(env_vars), "timestamp": _rfc3339_now()}
    if access_token:
        body["accessToken"] = access_token
    if default_user:
        body["defaultUser"] = default_user
    if default_workdir:
        body["defaultWorkdir"] = default_workdir
    payload = json.dumps(body).encode()
    head = f"POST /init HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
    if previous_token:
        head += f"X-Access-Token: {previous_token}\r\n"
    try:
        async with asyncio.timeout(10):
            response = await _exchange(address, port, head.encode() + b"\r\n" + payload)
    except (OSError, TimeoutError) as exc:
        raise RuntimeFailure(f"/init to the guest agent at {address}:{port} failed: {exc}") from exc
    if not 200 <= _status(response) < 300:
        raise RuntimeFailure(f"/init to the guest agent failed: {response[:200]!r}")


def _rfc3339_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


__all__ = ["RESET_ON_CLOSE", "init_agent", "wait_healthy"]

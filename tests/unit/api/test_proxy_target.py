"""The proxy's upstream URL is built from parts: whatever the request target, it reaches only the
sandbox's address and port.

The node's HTTP server parses targets with httptools, which normalises many odd ones away; h11 (the
other uvicorn parser) passes them through as ``raw_path``. So the proxy is driven here with the ASGI
scopes h11 produces, against two real TCP listeners: the "sandbox" and a "host port" that must never
be reached. No fakes besides the resolver, which names the sandbox listener's address.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from warren.api.proxy import SandboxProxy
from warren.orchestrator.states import SandboxState


@dataclass
class Listener:
    server: asyncio.Server | None = None
    request_lines: list[bytes] = field(default_factory=list)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.request_lines.append(head.split(b"\r\n", 1)[0])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()


@pytest.fixture
async def listeners() -> AsyncIterator[tuple[Listener, Listener]]:
    sandbox, host = Listener(), Listener()
    sandbox.server = await asyncio.start_server(sandbox._handle, "127.0.0.1", 0)
    host.server = await asyncio.start_server(host._handle, "127.0.0.1", 0)
    yield sandbox, host
    for lst in (sandbox, host):
        assert lst.server is not None
        lst.server.close()
        await lst.server.wait_closed()


async def _control_plane(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("a sandbox request reached the control plane")


async def _call(proxy: SandboxProxy, target: bytes, port: int) -> tuple[int, bytes]:
    """The scope uvicorn's h11 protocol makes of ``GET <target> HTTP/1.1``."""
    raw_path, _, query = target.partition(b"?")
    scope = {
        "type": "http",
        "method": "GET",
        "path": raw_path.decode("latin-1"),
        "raw_path": raw_path,
        "query_string": query,
        "headers": [(b"host", b"node"), (b"e2b-sandbox-id", b"isbx"), (b"e2b-sandbox-port", str(port).encode())],
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await proxy(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body


@pytest.mark.parametrize("target", ["@127.0.0.1:{port}/x", ":1@127.0.0.1:{port}/x", "*", "http://127.0.0.1:{port}/x"])
async def test_a_target_that_is_not_a_path_is_400_and_reaches_nothing(
    listeners: tuple[Listener, Listener], target: str
) -> None:
    sandbox, host = listeners
    proxy = SandboxProxy(_control_plane, lambda _: ("127.0.0.1", SandboxState.RUNNING), None)
    try:
        status, body = await _call(proxy, target.format(port=host.port).encode(), sandbox.port)
    finally:
        await proxy.aclose()
    assert status == 400 and json.loads(body)["code"] == 400
    assert host.request_lines == [] and sandbox.request_lines == []


@pytest.mark.parametrize(
    ("target", "forwarded"),
    [
        ("//127.0.0.1:{port}/x", "//127.0.0.1:{port}/x"),
        ("/a/../@127.0.0.1:{port}/x", "/@127.0.0.1:{port}/x"),  # dot segments are resolved, as httpx always did
        ("/%2F%2F127.0.0.1:{port}?q=@127.0.0.1", "/%2F%2F127.0.0.1:{port}?q=@127.0.0.1"),
    ],
)
async def test_a_path_goes_to_the_sandbox(listeners: tuple[Listener, Listener], target: str, forwarded: str) -> None:
    sandbox, host = listeners
    proxy = SandboxProxy(_control_plane, lambda _: ("127.0.0.1", SandboxState.RUNNING), None)
    raw = target.format(port=host.port).encode()
    try:
        status, body = await _call(proxy, raw, sandbox.port)
    finally:
        await proxy.aclose()
    assert (status, body) == (200, b"ok")
    assert host.request_lines == []
    assert sandbox.request_lines == [b"GET " + forwarded.format(port=host.port).encode() + b" HTTP/1.1"]

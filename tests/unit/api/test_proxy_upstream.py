"""The proxy's HTTP/1.1 hop to a sandbox port, against a real TCP listener standing in for the sandbox.

The "sandbox" is a scripted asyncio server: each test says what it answers. No fakes besides the
resolver, which names the listener's address.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from warren.api.proxy import SandboxProxy
from warren.api.proxy.forward import SandboxGone
from warren.orchestrator.states import SandboxState

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Sandbox"], Awaitable[None]]


@dataclass
class Sandbox:
    script: Script
    connections: int = 0
    bodies: list[bytes] = field(default_factory=list)
    server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.script(reader, writer, self)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _read_request(reader: asyncio.StreamReader, sandbox: Sandbox) -> dict[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        if line:
            key, _, value = line.partition(b":")
            headers[key.strip().lower()] = value.strip()
    body = b""
    if b"content-length" in headers:
        body = await reader.readexactly(int(headers[b"content-length"]))
    elif headers.get(b"transfer-encoding") == b"chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            body += (await reader.readexactly(size + 2))[:-2]
            if not size:
                break
    sandbox.bodies.append(body)
    return headers


async def _keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sandbox: Sandbox) -> None:
    while True:
        await _read_request(reader, sandbox)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
        await writer.drain()


async def _until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sandbox: Sandbox) -> None:
    await _read_request(reader, sandbox)
    writer.write(b"HTTP/1.0 200 OK\r\n\r\nall of it")
    await writer.drain()


async def _one_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sandbox: Sandbox) -> None:
    """Answers one request with keep-alive, then closes the connection while it sits idle."""
    await _read_request(reader, sandbox)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    await writer.drain()


async def _stream_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sandbox: Sandbox) -> None:
    await _read_request(reader, sandbox)
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
    await writer.drain()
    await reader.read()  # until the proxy resets the connection


@pytest.fixture
async def sandbox(request: pytest.FixtureRequest) -> AsyncIterator[Sandbox]:
    box = Sandbox(request.param)
    box.server = await asyncio.start_server(box._handle, "127.0.0.1", 0)
    yield box
    box.server.close()


async def _control_plane(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("a sandbox request reached the control plane")


def _proxy() -> SandboxProxy:
    return SandboxProxy(_control_plane, lambda _: ("127.0.0.1", SandboxState.RUNNING), None)


async def _call(
    proxy: SandboxProxy,
    port: int,
    *,
    body: list[bytes] | None = None,
    method: str = "POST",
    on_send: Callable[[], None] | None = None,
) -> tuple[int, bytes, list[dict[str, Any]]]:
    headers = [(b"e2b-sandbox-id", b"isbx"), (b"e2b-sandbox-port", str(port).encode())]
    pieces = list(body or [])
    if pieces:
        headers.append((b"transfer-encoding", b"chunked"))
    messages = [{"type": "http.request", "body": p, "more_body": i < len(pieces) - 1} for i, p in enumerate(pieces)]
    scope = {"type": "http", "method": method, "path": "/x", "raw_path": b"/x", "query_string": b"", "headers": headers}
    out: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        out.append(message)
        if on_send is not None and message.get("body"):
            on_send()

    await proxy(scope, receive, send)
    status = next(m["status"] for m in out if m["type"] == "http.response.start")
    data = b"".join(m.get("body", b"") for m in out if m["type"] == "http.response.body")
    return status, data, out


@pytest.mark.parametrize("sandbox", [_keep_alive], indirect=True)
async def test_requests_share_one_kept_alive_connection_and_bodies_are_streamed(sandbox: Sandbox) -> None:
    proxy = _proxy()
    try:
        for _ in range(3):
            status, data, sent = await _call(proxy, sandbox.port, body=[b"he", b"llo"])
            assert (status, data) == (200, b"ok")
            assert sent[-1] == {"type": "http.response.body", "body": b"ok", "more_body": False}
    finally:
        await proxy.aclose()
    assert sandbox.connections == 1
    assert sandbox.bodies == [b"hello"] * 3


@pytest.mark.parametrize("sandbox", [_until_close], indirect=True)
async def test_a_body_delimited_by_the_end_of_the_connection_arrives_whole(sandbox: Sandbox) -> None:
    proxy = _proxy()
    try:
        assert (await _call(proxy, sandbox.port, method="GET"))[:2] == (200, b"all of it")
        assert (await _call(proxy, sandbox.port, method="GET"))[:2] == (200, b"all of it")
    finally:
        await proxy.aclose()
    assert sandbox.connections == 2


@pytest.mark.parametrize("sandbox", [_one_then_close], indirect=True)
async def test_a_pooled_connection_the_sandbox_closed_is_replaced(sandbox: Sandbox) -> None:
    proxy = _proxy()
    try:
        assert (await _call(proxy, sandbox.port, method="GET"))[:2] == (200, b"ok")
        await asyncio.sleep(0.05)  # the sandbox closes the idle connection meanwhile
        assert (await _call(proxy, sandbox.port, method="GET"))[:2] == (200, b"ok")
    finally:
        await proxy.aclose()
    assert sandbox.connections == 2


async def test_a_closed_port_is_502() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    proxy = _proxy()
    try:
        status, data, _ = await _call(proxy, port, method="GET")
    finally:
        await proxy.aclose()
    assert status == 502 and b"is not open" in data


@pytest.mark.parametrize("sandbox", [_stream_forever], indirect=True)
async def test_abort_ends_an_open_stream(sandbox: Sandbox) -> None:
    proxy = _proxy()
    streaming = asyncio.Event()
    call = asyncio.ensure_future(_call(proxy, sandbox.port, method="GET", on_send=streaming.set))
    try:
        await streaming.wait()
        await proxy.abort("isbx")
        with pytest.raises(SandboxGone):
            await call
    finally:
        call.cancel()
        await proxy.aclose()

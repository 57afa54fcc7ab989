"""WebSockets through the node's proxy: they echo, and pause and kill cut them like HTTP streams.

A gVisor checkpoint fails while any connection to the sandbox is open (guest-agent-notes B3), so
a pause must first close the proxied WebSockets; a kill must not leave a client waiting on a
sandbox that is gone. The server in the sandbox is a tiny RFC 6455 echo server on the standard
library (the ``base`` template has no ``websockets``); the client is the ``websockets`` package.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest
from e2b import Sandbox
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.framework.node import Node

WS_PORT = 8765
_CLOSE_WAIT_S = 30.0
"""A bound on waiting for the close, not a timing assertion: without the cut, nothing ever closes."""

ECHO_SERVER = r"""
import base64, hashlib, socket, struct, threading

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def read_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def serve(conn):
    try:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                return
            head += chunk
        lines = head.split(b"\r\n")
        key = next(l.split(b":", 1)[1].strip() for l in lines if l.lower().startswith(b"sec-websocket-key:"))
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        while True:
            b0, b1 = read_exact(conn, 2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", read_exact(conn, 2))[0]
            elif n == 127:
                n = struct.unpack("!Q", read_exact(conn, 8))[0]
            mask = read_exact(conn, 4) if b1 & 0x80 else b"\0\0\0\0"
            payload = bytes(c ^ mask[i % 4] for i, c in enumerate(read_exact(conn, n)))
            opcode = b0 & 0x0F
            if opcode == 8:
                conn.sendall(bytes([0x88, len(payload)]) + payload)
                return
            if opcode == 9:
                opcode = 10
            header = bytes([0x80 | opcode]) + (bytes([n]) if n < 126 else bytes([126]) + struct.pack("!H", n))
            conn.sendall(header + payload)
    except (EOFError, OSError):
        pass
    finally:
        conn.close()


listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("0.0.0.0", PORT))
listener.listen()
while True:
    threading.Thread(target=serve, args=(listener.accept()[0],), daemon=True).start()
""".replace("PORT", str(WS_PORT))

WAIT_FOR_PORT = f"""
import socket, time
deadline = time.monotonic() + 30
while True:
    try:
        socket.create_connection(("127.0.0.1", {WS_PORT}), timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
"""


@contextmanager
def _echo_socket(node: Node, sbx: Sandbox) -> Iterator[ClientConnection]:
    """A WebSocket to the echo server in ``sbx``, through the node's proxy, checked with one echo."""
    sbx.files.write("/tmp/ws_echo.py", ECHO_SERVER)
    sbx.files.write("/tmp/wait.py", WAIT_FOR_PORT)
    sbx.commands.run("python3 /tmp/ws_echo.py", background=True)
    assert sbx.commands.run("python3 /tmp/wait.py", timeout=60).exit_code == 0
    netloc = urlsplit(node.url).netloc
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(WS_PORT)}
    with connect(f"ws://{netloc}/echo", additional_headers=headers, open_timeout=10) as ws:
        ws.send("hello")
        assert ws.recv(timeout=10) == "hello"
        yield ws


def _wait_closed(ws: ClientConnection) -> None:
    with pytest.raises(ConnectionClosed):
        ws.recv(timeout=_CLOSE_WAIT_S)  # a TimeoutError instead fails the test: nothing closed it


def test_pause_closes_a_proxied_websocket(node: Node, sbx: Sandbox, runtime: str) -> None:
    with _echo_socket(node, sbx) as ws:
        assert sbx.pause() is True  # gVisor: the checkpoint succeeds although the socket was open
        _wait_closed(ws)
    resumed = Sandbox.connect(sbx.sandbox_id)
    assert resumed.commands.run("echo back").stdout.strip() == "back"


def test_kill_closes_a_proxied_websocket(node: Node, sbx: Sandbox) -> None:
    with _echo_socket(node, sbx) as ws:
        sbx.kill()
        _wait_closed(ws)

"""The guest agent bundle for sandbox tests, and a stand-in guest package.

``agent_bundle`` (session fixture) builds the bundle once per session into a temp cache. Which guest
goes in is chosen by ``WARREN_TEST_GUEST``: ``standin`` (a 10-line stdlib server answering
``GET /health`` with 204), ``real`` (``warren/guest``), or ``auto`` (default: real when
``warren/guest/main.py`` exists).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import time
from pathlib import Path

import pytest

from warren.runtime.agent_bundle import build_agent_bundle

__all__ = ["STANDIN_MAIN", "agent_bundle", "guest_source", "wait_for_health", "write_standin_guest"]

REAL_GUEST = Path(__file__).resolve().parents[2] / "warren" / "guest"

STANDIN_MAIN = '''\
"""Stand-in guest agent for runtime tests: GET /health -> 204 on $WARREN_AGENT_PORT."""
import http.server
import os


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(204 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def main():
    port = int(os.environ["WARREN_AGENT_PORT"])
    http.server.ThreadingHTTPServer(("0.0.0.0", port), _Handler).serve_forever()
'''


def write_standin_guest(dest: Path) -> Path:
    """Write the stand-in guest package to ``dest`` (a directory) and return it."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "__init__.py").write_text("")
    (dest / "main.py").write_text(STANDIN_MAIN)
    return dest


def guest_source(tmp: Path) -> Path:
    choice = os.environ.get("WARREN_TEST_GUEST", "auto")
    if choice == "real" or (choice == "auto" and (REAL_GUEST / "main.py").is_file()):
        return REAL_GUEST
    return write_standin_guest(tmp / "guest")


@pytest.fixture(scope="session")
def agent_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A built agent bundle directory (see the module docstring for which guest it holds)."""
    base = tmp_path_factory.mktemp("agent")
    return asyncio.run(build_agent_bundle(base / "cache", guest_source(base)))


_RESET_ON_CLOSE = struct.pack("ii", 1, 0)


async def wait_for_health(address: str, port: int) -> float:
    """Poll ``GET /health`` until it answers 204; return the seconds it took.

    No deadline of its own: wrap it, ``async with asyncio.timeout(10): await wait_for_health(...)``.
    Each connection is closed by the host with a reset (SO_LINGER 0): a connection the agent closes
    first lingers in TIME_WAIT inside gVisor's netstack for 60 s and makes a checkpoint fail (B3).
    """
    started = time.monotonic()
    request = f"GET /health HTTP/1.1\r\nHost: {address}\r\n\r\n".encode()
    while True:
        try:
            reader, writer = await asyncio.open_connection(address, port)
        except OSError:
            await asyncio.sleep(0.003)
            continue
        try:
            writer.write(request)
            await writer.drain()
            status = await reader.readline()
        except OSError:
            status = b""
        finally:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        if status.split()[1:2] == [b"204"]:
            return time.monotonic() - started
        await asyncio.sleep(0.003)

"""A minimal DNS stub resolver (A records over UDP) for the egress proxy, asking the resolvers sandboxes use.

When a connection is allowed only by the name it announced (its address is denied), the proxy dials that
name's addresses rather than the one the sandbox chose, so an allowed name cannot carry a sandbox to a
denied address. Answers are cached for their TTL (5 s to 5 min). Responses are parsed defensively: every
length is bounds-checked and compression pointers are followed a bounded number of times.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from collections.abc import Sequence

__all__ = ["StubResolver", "parse_a_records", "query_packet"]

_MIN_TTL, _MAX_TTL = 5, 300
_CACHE_MAX = 4096
_TIMEOUT_S = 2.0


def query_packet(qid: int, name: str) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode("ascii") for p in name.split(".") if p)
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + labels + b"\x00" + struct.pack("!HH", 1, 1)


def _skip_name(data: bytes, pos: int) -> int:
    for _ in range(128):
        if pos >= len(data):
            raise ValueError("truncated name")
        length = data[pos]
        if length == 0:
            return pos + 1
        if length & 0xC0 == 0xC0:
            return pos + 2
        pos += 1 + length
    raise ValueError("name too long")


def parse_a_records(data: bytes, qid: int) -> tuple[list[str], int]:
    """(IPv4 addresses, smallest TTL) of a response to query ``qid``; ([], 0) for an error answer."""
    if len(data) < 12:
        raise ValueError("short response")
    rid, flags, qdcount, ancount = struct.unpack_from("!HHHH", data)
    if rid != qid or not flags & 0x8000:
        raise ValueError("not our answer")
    if flags & 0xF:
        return [], 0
    pos = 12
    for _ in range(qdcount):
        pos = _skip_name(data, pos) + 4
    out: list[str] = []
    ttl = _MAX_TTL
    for _ in range(ancount):
        pos = _skip_name(data, pos)
        if pos + 10 > len(data):
            raise ValueError("truncated answer")
        rtype, _, rttl, rdlen = struct.unpack_from("!HHIH", data, pos)
        pos += 10
        if rtype == 1 and rdlen == 4 and pos + 4 <= len(data):
            out.append(socket.inet_ntoa(data[pos:pos + 4]))
            ttl = min(ttl, rttl)
        pos += rdlen
    return out, ttl


class _Answer(asyncio.DatagramProtocol):
    def __init__(self, future: asyncio.Future[bytes]) -> None:
        self.future = future

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        if not self.future.done():
            self.future.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


class StubResolver:
    def __init__(self, servers: Sequence[str]) -> None:
        self.servers = tuple(servers)
        self._cache: dict[str, tuple[float, list[str]]] = {}

    async def _ask(self, server: str, name: str) -> tuple[list[str], int]:
        loop = asyncio.get_running_loop()
        qid = int.from_bytes(os.urandom(2), "big")
        future: asyncio.Future[bytes] = loop.create_future()
        transport, _ = await loop.create_datagram_endpoint(lambda: _Answer(future), remote_addr=(server, 53))
        try:
            transport.sendto(query_packet(qid, name))
            async with asyncio.timeout(_TIMEOUT_S):
                return parse_a_records(await future, qid)
        finally:
            transport.close()

    async def resolve(self, name: str) -> list[str]:
        """The IPv4 addresses of ``name`` (empty when no resolver answers with any)."""
        now = time.monotonic()
        hit = self._cache.get(name)
        if hit is not None and hit[0] > now:
            return hit[1]
        for server in self.servers:
            try:
                addresses, ttl = await self._ask(server, name)
            except (OSError, ValueError, TimeoutError):
                continue
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[name] = (now + max(_MIN_TTL, min(ttl, _MAX_TTL)), addresses)
            return addresses
        return []

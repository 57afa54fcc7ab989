"""The node's transparent egress proxy: the connections per-sandbox nft rules redirect to it.

For each connection: which sandbox (by source address), where it was going (``SO_ORIGINAL_DST``), and
what name its first bytes announce (TLS SNI or HTTP ``Host``, read with ``MSG_PEEK`` so nothing is
consumed). Then the sandbox's policy decides:

* refused: the connection is closed;
* allowed, no header rule for the name: the proxy connects to the original destination and splices;
* allowed with header rules: HTTP requests get the headers set (and ``Connection: close``, so each
  request of the connection is seen); HTTPS is terminated with a certificate from the node's egress CA
  (:mod:`egress_ca`), re-encrypted to the upstream (verified against the system trust store and the
  node's extra CA file), and rewritten the same way.

The proxy dials out from the host, so it refuses the node's blocked ranges itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Sequence

from warren.runtime.net.dns import StubResolver
from warren.runtime.net.egress_ca import EgressCA
from warren.runtime.net.egress_policy import CompiledEgress
from warren.runtime.net.sniff import MAX_SNIFF, Kind, sniff
from warren.runtime.net.socks import SocksError, socks_dial

__all__ = ["EgressProxy", "ProxyThread"]

_log = logging.getLogger(__name__)

SO_ORIGINAL_DST = 80
SNIFF_TIMEOUT_S = 5.0
"""A client that says nothing this long (a server-speaks-first protocol) is judged by address alone."""
CONNECT_TIMEOUT_S = 15.0
HEAD_LIMIT = 65536
_CHUNK = 65536

Lookup = Callable[[str], CompiledEgress | None]
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _original_dst(sock: socket.socket) -> tuple[str, int]:
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(packed), port


async def _readable(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(sock.fileno(), ready)
    try:
        await fut
    finally:
        loop.remove_reader(sock.fileno())


async def _peek(sock: socket.socket) -> tuple[Kind, str | None]:
    """The kind and name of what the client sent so far, without consuming it."""
    data = b""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(SNIFF_TIMEOUT_S):
            while True:
                await _readable(sock)
                try:
                    data = sock.recv(MAX_SNIFF, socket.MSG_PEEK)
                except BlockingIOError:
                    continue
                complete, kind, name = sniff(data)
                if complete or not data:
                    return kind, name
                await asyncio.sleep(0.005)  # more is on its way; the peeked bytes stay readable
    return sniff(data)[1], None


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # TCP: half-close, the other direction may still be talking
        else:
            writer.close()  # TLS has no half-close: the exchange is over
    except (OSError, ssl.SSLError):
        writer.close()


async def _splice(a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                  b: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
    try:
        await asyncio.gather(_pipe(a[0], b[1]), _pipe(b[0], a[1]))
    finally:
        for w in (a[1], b[1]):
            w.close()


def rewrite_head(head: bytes, headers: Sequence[tuple[str, str]]) -> bytes:
    """A request head with ``headers`` set (replacing any of the same name) and ``Connection: close``."""
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    names = {n.lower().encode() for n, _ in headers} | {b"connection", b"proxy-connection", b"keep-alive"}
    kept = [lines[0]] + [ln for ln in lines[1:] if ln.split(b":", 1)[0].strip().lower() not in names]
    kept += [f"{n}: {v}".encode() for n, v in headers] + [b"Connection: close"]
    return b"\r\n".join(kept) + b"\r\n\r\n"


class EgressProxy:
    def __init__(self, lookup: Lookup, blocked: Sequence[str], ca: EgressCA,
                 upstream_ca_file: str | None = None, dns_servers: Sequence[str] = ()) -> None:
        self._lookup = lookup
        self.resolver = StubResolver(dns_servers)
        self.blocked = [ipaddress.IPv4Network(b) for b in blocked]
        self.ca = ca
        self._upstream = ssl.create_default_context()
        if upstream_ca_file:
            self._upstream.load_verify_locations(upstream_ca_file)
        self._upstream.set_alpn_protocols(["http/1.1"])
        self._listener: socket.socket | None = None
        self._acceptor: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self) -> int:
        """Listen on an ephemeral port on every address (only redirected sandbox traffic reaches it from
        sandboxes, and a peer that is not a sandbox with a policy is closed at once)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", 0))
        listener.listen(1024)
        listener.setblocking(False)
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        self._acceptor = asyncio.create_task(self._accept_loop(listener), name="egress-proxy-accept")
        return self.port

    async def close(self) -> None:
        tasks = [t for t in (self._acceptor, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._acceptor = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE and friends: do not spin
                _log.warning("egress proxy accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            conn.setblocking(False)
            # asyncio sets TCP_NODELAY only on sockets whose proto says TCP; accepted ones say 0.
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = asyncio.create_task(self._serve(conn), name="egress-conn")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, sock: socket.socket) -> None:
        try:
            await self._handle(sock)
        except SocksError as exc:
            _log.warning("egress through the upstream proxy failed: %s", exc)
        except (OSError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            _log.debug("egress connection ended: %r", exc)
        finally:
            sock.close()

    async def _dial(self, policy: CompiledEgress, dst: str, port: int, name: str | None,
                    tls: ssl.SSLContext | None = None) -> Streams:
        """The upstream connection: direct, or through the sandbox's SOCKS5 proxy (names it matched by
        name, the rest by address)."""
        up = policy.policy.upstream
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            if up is None:
                return await _dial_direct(dst, port, name, tls)
            matched = name if name is not None and policy.name_allowed(name) else None
            return await socks_dial(up, self.blocked, dst, port, matched, tls)

    async def _handle(self, sock: socket.socket) -> None:
        peer = sock.getpeername()[0]
        policy = self._lookup(peer)
        if policy is None:
            return
        dst, port = _original_dst(sock)
        if any(ipaddress.IPv4Address(dst) in net for net in self.blocked):
            return
        kind, name = await _peek(sock)
        if not policy.allows(dst, name):
            _log.info("egress from %s to %s:%d (%s) refused by its policy", peer, dst, port, name or "no name")
            return
        if policy.policy.upstream is None and name is not None and policy.only_by_name(dst, name):
            # Allowed by its name alone: dial the name's addresses (the node's resolvers), never one a
            # sandbox picked to carry an allowed name to a denied address. With a SOCKS5 upstream the
            # proxy resolves the name (it is sent as a name).
            addresses = [a for a in await self.resolver.resolve(name)
                         if not any(ipaddress.IPv4Address(a) in net for net in self.blocked)]
            if not addresses:
                _log.info("egress from %s to %s refused: the name does not resolve to an allowed address", peer, name)
                return
            dst = dst if dst in addresses else addresses[0]
        headers = policy.headers_for(name) if kind is not Kind.OTHER else None
        loop = asyncio.get_running_loop()
        if headers is None:
            client = await asyncio.open_connection(sock=sock.dup())
            upstream = await self._dial(policy, dst, port, name if kind is not Kind.OTHER else None)
            await _splice(client, upstream)
            return
        assert name is not None
        if kind is Kind.TLS:
            reader = asyncio.StreamReader(limit=HEAD_LIMIT)
            protocol = asyncio.StreamReaderProtocol(reader)
            transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock.dup(),
                                                              ssl=self.ca.server_context(name))
            client = (reader, asyncio.StreamWriter(transport, protocol, reader, loop))
            upstream = await self._dial(policy, dst, port, name, self._upstream)
        else:
            client = await asyncio.open_connection(sock=sock.dup(), limit=HEAD_LIMIT)
            upstream = await self._dial(policy, dst, port, name)
        try:
            head = await client[0].readuntil(b"\r\n\r\n")
            upstream[1].write(rewrite_head(head, headers))
            await upstream[1].drain()
        except BaseException:
            for w in (client[1], upstream[1]):
                w.close()
            raise
        await _splice(client, upstream)


async def _dial_direct(dst: str, port: int, name: str | None, tls: ssl.SSLContext | None) -> Streams:
    return await asyncio.open_connection(dst, port, ssl=tls, server_hostname=name if tls else None)


class ProxyThread:
    """Runs an :class:`EgressProxy` on a thread of its own, on asyncio's selector loop: the data path stays
    off the API's loop, and uvloop (the node's) truncates TLS streams whose peer closes right after
    writing, which HTTP/1.1 servers answering ``Connection: close`` do."""

    def __init__(self, proxy: EgressProxy) -> None:
        self.proxy = proxy
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def start(self) -> int:
        loop = asyncio.SelectorEventLoop()
        thread = threading.Thread(target=loop.run_forever, name="egress-proxy", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.proxy.start(), loop))

    async def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = self._thread = None
        try:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.proxy.close(), loop))
        finally:
            loop.call_soon_threadsafe(loop.stop)
            await asyncio.to_thread(thread.join, 10)
            if not thread.is_alive():
                loop.close()

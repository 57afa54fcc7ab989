"""The egress proxy over loopback: a TLS upstream, a client that trusts only the node's egress CA, and
the original destination given directly (no nft redirect here). Large bodies stream both ways, under
asyncio's loop and uvloop (the node's), the proxy on its own thread as the node runs it."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from warren.runtime.net import egress_proxy
from warren.runtime.net.egress_ca import EgressCA
from warren.runtime.net.egress_policy import compile_egress
from warren.runtime.net.egress_proxy import EgressProxy, ProxyThread
from warren.store import EgressPolicy, HostRule

SIZE = 8 << 20


def _upstream_cert(d: Path) -> tuple[Path, Path, Path]:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "t")])
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("allowed.test")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (d / "c.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "k.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    return d / "c.pem", d / "k.pem", d / "c.pem"


async def _scenario(tmp: Path, tls: bool) -> None:
    cert, key, ca_file = _upstream_cert(tmp)
    seen: list[bytes] = []

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head)
        body = await reader.readexactly(SIZE)
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        writer.close()

    server_ctx = None
    if tls:
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(cert, key)
    server = await asyncio.start_server(upstream, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    policy = compile_egress(EgressPolicy(rules=(HostRule("allowed.test", (("Authorization", "Bearer s"),)),)))
    proxy = EgressProxy(lambda peer: policy, [], EgressCA(None), str(ca_file))
    thread = ProxyThread(proxy)
    original = egress_proxy._original_dst
    egress_proxy._original_dst = lambda sock: ("127.0.0.1", port)  # type: ignore[assignment]
    try:
        await thread.start()
        client_ctx = None
        if tls:
            client_ctx = ssl.create_default_context(cadata=proxy.ca.pem.decode())
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port, ssl=client_ctx,
                                                       server_hostname="allowed.test" if tls else None)
        body = b"y" * SIZE
        writer.write(b"POST /up HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: mine\r\n"
                     + f"Content-Length: {SIZE}\r\n\r\n".encode() + body)
        await writer.drain()
        # The upstream closes right after its answer: the client reads to the end of the stream.
        answer = await asyncio.wait_for(reader.read(-1), 20)
        head, _, got = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and got == body
        writer.close()
        assert b"Authorization: Bearer s\r\n" in seen[0] and b"mine" not in seen[0]
    finally:
        egress_proxy._original_dst = original  # type: ignore[assignment]
        await thread.close()
        server.close()


def _loops() -> list[Callable[[], asyncio.AbstractEventLoop]]:
    loops: list[Callable[[], asyncio.AbstractEventLoop]] = [asyncio.new_event_loop]
    try:
        import uvloop
    except ImportError:
        return loops
    return [*loops, uvloop.new_event_loop]


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
@pytest.mark.parametrize("new_loop", _loops(), ids=lambda f: f.__module__.split(".")[0])
def test_large_bodies_stream_through_a_header_rule(tmp_path: Path, tls: bool,
                                                   new_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    loop = new_loop()
    try:
        coro: Coroutine[Any, Any, None] = _scenario(tmp_path, tls)
        loop.run_until_complete(asyncio.wait_for(coro, 60))
    finally:
        loop.close()

"""A SOCKS5 client (RFC 1928, with RFC 1929 username/password) for the egress proxy's upstream dials.

The proxy's host is resolved at every dial; an address in a blocked range is never dialled (fail closed,
as every other failure here: the sandbox's connection is closed, nothing falls back to a direct dial).
Names the policy matched go to the proxy as names (ATYP 3, remote DNS), the rest as IPv4 addresses.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Sequence

from warren.store import UpstreamProxy

__all__ = ["SocksError", "socks_dial"]

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]

_REPLIES = {1: "general failure", 2: "not allowed by ruleset", 3: "network unreachable", 4: "host unreachable",
            5: "connection refused", 6: "TTL expired", 7: "command not supported", 8: "address type not supported"}


class SocksError(OSError):
    """The SOCKS5 proxy could not be reached, refused us, or does not speak SOCKS5."""


def _proxy_tls(up: UpstreamProxy) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=up.ca_cert) if up.ca_cert else ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


async def _connect(up: UpstreamProxy, blocked: Sequence[ipaddress.IPv4Network]) -> Streams:
    host, _, port_text = up.address.rpartition(":")
    port = int(port_text)
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, family=socket.AF_INET, type=socket.SOCK_STREAM)
    addresses = [str(info[4][0]) for info in infos]
    usable = [a for a in addresses if not any(ipaddress.IPv4Address(a) in net for net in blocked)]
    if not usable:
        raise SocksError(f"egress proxy {up.address} resolves to no allowed address ({addresses})")
    tls = _proxy_tls(up) if up.tls else None
    return await asyncio.open_connection(usable[0], port, ssl=tls,
                                         server_hostname=(up.server_name or host) if tls else None)


async def _handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: UpstreamProxy,
                     dst: str, port: int, name: str | None) -> None:
    methods = b"\x00\x02" if up.username is not None else b"\x00"
    writer.write(b"\x05" + bytes([len(methods)]) + methods)
    version, method = await reader.readexactly(2)
    if version != 5 or method not in methods:
        raise SocksError(f"egress proxy {up.address} does not speak SOCKS5 with us (method {method})")
    if method == 2:
        user, password = (up.username or "").encode(), (up.password or "").encode()
        writer.write(b"\x01" + bytes([len(user)]) + user + bytes([len(password)]) + password)
        if (await reader.readexactly(2))[1] != 0:
            raise SocksError(f"egress proxy {up.address} refused the username and password")
    if name is not None:
        target = b"\x03" + bytes([len(name)]) + name.encode()
    else:
        target = b"\x01" + socket.inet_aton(dst)
    writer.write(b"\x05\x01\x00" + target + port.to_bytes(2, "big"))
    version, reply, _, atyp = await reader.readexactly(4)
    if version != 5 or reply != 0:
        raise SocksError(f"egress proxy {up.address}: {_REPLIES.get(reply, f'reply {reply}')}")
    size = {1: 4, 4: 16}.get(atyp)
    if size is None:
        size = (await reader.readexactly(1))[0]
    await reader.readexactly(size + 2)


async def socks_dial(up: UpstreamProxy, blocked: Sequence[ipaddress.IPv4Network], dst: str, port: int,
                     name: str | None, tls: ssl.SSLContext | None = None) -> Streams:
    """A stream to ``dst:port`` (or ``name:port``) through ``up``; TLS to the destination when ``tls``."""
    reader, writer = await _connect(up, blocked)
    try:
        await _handshake(reader, writer, up, dst, port, name)
        if tls is not None:
            await writer.start_tls(tls, server_hostname=name)
    except asyncio.IncompleteReadError as exc:
        writer.close()
        raise SocksError(f"egress proxy {up.address} closed the connection during the SOCKS5 handshake") from exc
    except BaseException:
        writer.close()
        raise
    return reader, writer

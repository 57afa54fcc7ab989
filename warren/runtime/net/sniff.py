"""The destination name a client's first bytes announce: TLS SNI or an HTTP/1 ``Host`` header.

Pure functions over bytes a sandbox sent (hostile): every length is bounds-checked, nothing recurses.
``sniff`` answers ``(complete, kind, name)``; incomplete means "wait for more bytes".
"""

from __future__ import annotations

import enum

__all__ = ["MAX_SNIFF", "Kind", "http_host", "sniff"]

MAX_SNIFF = 16384
"""Bytes looked at before deciding; a ClientHello or request head beyond it is judged without a name."""

_METHODS = (b"GET ", b"POST ", b"PUT ", b"HEAD ", b"DELETE ", b"OPTIONS ", b"PATCH ", b"CONNECT ", b"TRACE ")


class Kind(enum.Enum):
    TLS = "tls"
    HTTP = "http"
    OTHER = "other"


def _clean(name: bytes) -> str | None:
    try:
        text = name.decode("ascii").strip().lower().rstrip(".")
    except UnicodeDecodeError:
        return None
    if not text or len(text) > 253 or any(not (c.isalnum() or c in "-._") for c in text):
        return None
    return text


def _client_hello_sni(data: bytes) -> tuple[bool, str | None]:
    """(complete, server name) of a TLS record carrying a ClientHello."""
    if len(data) < 5:
        return False, None
    record_len = int.from_bytes(data[3:5], "big")
    end = 5 + record_len
    if len(data) < end and end <= MAX_SNIFF:
        return False, None
    body = data[5:min(end, len(data))]
    if len(body) < 4 or body[0] != 1:  # handshake type 1: ClientHello
        return True, None
    pos = 4 + 2 + 32  # handshake header, client version, random
    if pos >= len(body):
        return True, None
    pos += 1 + body[pos]  # session id
    if pos + 2 > len(body):
        return True, None
    pos += 2 + int.from_bytes(body[pos:pos + 2], "big")  # cipher suites
    if pos >= len(body):
        return True, None
    pos += 1 + body[pos]  # compression methods
    if pos + 2 > len(body):
        return True, None
    ext_end = min(len(body), pos + 2 + int.from_bytes(body[pos:pos + 2], "big"))
    pos += 2
    while pos + 4 <= ext_end:
        ext_type = int.from_bytes(body[pos:pos + 2], "big")
        ext_len = int.from_bytes(body[pos + 2:pos + 4], "big")
        pos += 4
        if ext_type == 0 and pos + 5 <= ext_end:  # server_name: list length, type, name length, name
            if body[pos + 2] == 0:
                name_len = int.from_bytes(body[pos + 3:pos + 5], "big")
                return True, _clean(body[pos + 5:pos + 5 + name_len])
            return True, None
        pos += ext_len
    return True, None


def http_host(head: bytes) -> str | None:
    """The ``Host`` of a request head (without a port), else the host of an absolute-form target."""
    lines = head.split(b"\r\n")
    for line in lines[1:]:
        if not line:
            break
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"host":
            host = value.strip()
            if host.startswith(b"["):
                return None
            return _clean(host.rsplit(b":", 1)[0] if b":" in host else host)
    parts = lines[0].split(b" ")
    if len(parts) >= 2 and parts[1].lower().startswith(b"http://"):
        authority = parts[1][7:].split(b"/", 1)[0]
        return _clean(authority.rsplit(b":", 1)[0] if b":" in authority else authority)
    return None


def sniff(data: bytes) -> tuple[bool, Kind, str | None]:
    """What ``data`` (the first bytes of a connection) says so far."""
    if not data:
        return False, Kind.OTHER, None
    if data[0] == 0x16:
        complete, name = _client_hello_sni(data[:MAX_SNIFF])
        return complete or len(data) >= MAX_SNIFF, Kind.TLS, name
    probe = data[:8]
    if any(m.startswith(probe) or probe.startswith(m) for m in _METHODS):
        if not any(probe.startswith(m) for m in _METHODS):
            return len(data) >= MAX_SNIFF, Kind.HTTP, None  # a method not fully here yet
        end = data.find(b"\r\n\r\n", 0, MAX_SNIFF)
        if end < 0:
            return len(data) >= MAX_SNIFF, Kind.HTTP, None
        return True, Kind.HTTP, http_host(data[:end + 2])
    return True, Kind.OTHER, None

"""Helpers shared by the guest agent tests: Connect framing and SDK objects pointed at an agent."""

from __future__ import annotations

import json
import struct
from typing import Any

import httpx
from e2b import AsyncSandbox, Sandbox
from e2b.connection_config import ConnectionConfig
from packaging.version import Version

ENVD_VERSION = Version("0.6.13")
STREAM = "application/connect+json"


def envelope(msg: dict[str, Any], flags: int = 0) -> bytes:
    payload = json.dumps(msg).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


def parse_envelopes(data: bytes) -> list[tuple[int, dict[str, Any]]]:
    out = []
    i = 0
    while i < len(data):
        flags, length = struct.unpack_from(">BI", data, i)
        out.append((flags, json.loads(data[i + 5 : i + 5 + length])))
        i += 5 + length
    assert i == len(data), "trailing bytes after the last envelope"
    return out


def stream_call(
    client: httpx.Client,
    method: str,
    msg: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> tuple[httpx.Response, list[tuple[int, dict[str, Any]]]]:
    """A server-stream call read to its end: (response, [(flags, message)])."""
    r = client.post(
        "/" + method,
        content=envelope(msg),
        headers={"content-type": STREAM, "connect-protocol-version": "1", **(headers or {})},
    )
    return r, parse_envelopes(r.content)


def unary(client: httpx.Client, method: str, msg: dict[str, Any], **headers: str) -> httpx.Response:
    return client.post("/" + method, json=msg, headers={"connect-protocol-version": "1", **headers})


def _config(url: str, token: str | None) -> ConnectionConfig:
    headers = {"E2b-Sandbox-Id": "sbx-test", "E2b-Sandbox-Port": "49983"}
    if token:
        headers["X-Access-Token"] = token
    return ConnectionConfig(sandbox_url=url, api_key="e2b_test", extra_sandbox_headers=headers)


def make_sandbox(url: str, token: str | None = None) -> Sandbox:
    """The unmodified SDK's Sandbox for an agent, built the way ``Sandbox.connect`` builds it."""
    return Sandbox(
        sandbox_id="sbx-test",
        sandbox_domain=None,
        envd_version=ENVD_VERSION,
        envd_access_token=token,
        traffic_access_token=None,
        connection_config=_config(url, token),
    )


def make_async_sandbox(url: str, token: str | None = None) -> AsyncSandbox:
    return AsyncSandbox(
        sandbox_id="sbx-test",
        sandbox_domain=None,
        envd_version=ENVD_VERSION,
        envd_access_token=token,
        traffic_access_token=None,
        connection_config=_config(url, token),
    )

"""The Connect protocol with the JSON codec: unary calls, server streams and client streams.

Unary: ``POST /<pkg.Service>/<Method>``, ``application/json`` in and out; an error is a non-200 status
with ``{"code", "message"}``. Streams: ``application/connect+json`` with 5-byte envelopes
``[flags][length BE32][json]``; a server stream ends with an end-stream envelope (flags 0x02) holding
``{}`` or ``{"error": {...}}``.

Messages are plain dicts in proto3 canonical JSON: the field readers below accept both lowerCamelCase
and the proto (snake_case) names, int64 as string or number, bytes as (URL-safe or standard) base64,
and enums by name or number. Handlers build replies in lowerCamelCase and leave defaults out.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .errors import RpcError
from .server import BodyTooLarge, Request, Response

if TYPE_CHECKING:
    from .state import Agent
    from .users import User

log = logging.getLogger("warren.guest")

Message = dict[str, Any]
"""A decoded (or to-be-encoded) protobuf message in proto3 JSON form."""

UNARY_CONTENT_TYPE = "application/json"
STREAM_CONTENT_TYPE = "application/connect+json"
FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02
MAX_MESSAGE_BYTES = 64 << 20
"""Largest request message accepted (SendInput carries stdin data)."""

# --------------------------------------------------------------------------- field readers


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def field(msg: Mapping[str, Any] | None, name: str) -> Any:
    """The value of field ``name`` (given in snake_case) under its JSON or proto name, else None."""
    if not msg:
        return None
    camel = _camel(name)
    if camel in msg:
        return msg[camel]
    return msg.get(name)


def get_str(msg: Mapping[str, Any] | None, name: str, default: str = "") -> str:
    value = field(msg, name)
    if value is None:
        return default
    if not isinstance(value, str):
        raise RpcError("invalid_argument", f"field {name!r} must be a string")
    return value


def get_opt_str(msg: Mapping[str, Any] | None, name: str) -> str | None:
    value = field(msg, name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise RpcError("invalid_argument", f"field {name!r} must be a string")
    return value


def get_int(msg: Mapping[str, Any] | None, name: str, default: int = 0) -> int:
    value = field(msg, name)
    if value is None:
        return default
    if isinstance(value, bool):
        raise RpcError("invalid_argument", f"field {name!r} must be a number")
    try:
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError
            return int(value)
        return int(value)
    except (TypeError, ValueError):
        raise RpcError("invalid_argument", f"field {name!r} must be an integer") from None


def get_bool(msg: Mapping[str, Any] | None, name: str) -> bool | None:
    value = field(msg, name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise RpcError("invalid_argument", f"field {name!r} must be a boolean")
    return value


def get_msg(msg: Mapping[str, Any] | None, name: str) -> Message | None:
    value = field(msg, name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RpcError("invalid_argument", f"field {name!r} must be an object")
    return value


def get_list(msg: Mapping[str, Any] | None, name: str) -> list[str]:
    value = field(msg, name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RpcError("invalid_argument", f"field {name!r} must be a list of strings")
    return list(value)


def get_map(msg: Mapping[str, Any] | None, name: str) -> dict[str, str]:
    value = field(msg, name)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise RpcError("invalid_argument", f"field {name!r} must be a map of strings")
    return dict(value)


def get_bytes(msg: Mapping[str, Any] | None, name: str) -> bytes | None:
    value = field(msg, name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise RpcError("invalid_argument", f"field {name!r} must be base64")
    return decode_b64(value)


def decode_b64(value: str) -> bytes:
    """proto3 JSON bytes: standard or URL-safe base64, padded or not."""
    text = value.replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RpcError("invalid_argument", "invalid base64 in bytes field") from None


def encode_b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def get_enum(msg: Mapping[str, Any] | None, name: str, values: Mapping[str, int]) -> int:
    """An enum field given by name or number; 0 when absent."""
    value = field(msg, name)
    if value is None:
        return 0
    if isinstance(value, str):
        if value in values:
            return values[value]
        raise RpcError("invalid_argument", f"unknown value {value!r} for enum field {name!r}")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise RpcError("invalid_argument", f"field {name!r} must be an enum name or number")


def dumps(msg: Message) -> bytes:
    return json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode()


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def end_stream(error: RpcError | None = None) -> bytes:
    body: Message = {"error": error.to_json()} if error else {}
    return envelope(dumps(body), FLAG_END_STREAM)


# --------------------------------------------------------------------------- calls


class Call:
    """One RPC: the agent, the HTTP request, the caller's user and the deadline/keepalive headers."""

    def __init__(self, agent: Agent, request: Request, user: User) -> None:
        self.agent = agent
        self.request = request
        self.user = user
        self.timeout_s = _timeout_s(request)
        self.keepalive_s = _keepalive_s(request)


def _timeout_s(request: Request) -> float | None:
    raw = request.header("connect-timeout-ms")
    if not raw:
        return None
    try:
        ms = int(raw)
    except ValueError:
        raise RpcError("invalid_argument", f"invalid Connect-Timeout-Ms {raw!r}") from None
    return ms / 1000.0 if ms > 0 else None


def _keepalive_s(request: Request) -> float | None:
    raw = request.header("keepalive-ping-interval")
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        return None
    return value if value > 0 else None


Unary = Callable[[Call, Message], Awaitable[Message]]
ServerStream = Callable[[Call, Message], AsyncIterator[Any]]
ClientStream = Callable[[Call, AsyncIterator[Message]], Awaitable[Message]]


@dataclass(frozen=True)
class Method:
    """One RPC method. ``own_deadline``: the handler enforces Connect-Timeout-Ms itself."""

    kind: Literal["unary", "server_stream", "client_stream"]
    fn: Any
    own_deadline: bool = False


def unary(fn: Unary) -> Method:
    return Method("unary", fn)


def server_stream(fn: ServerStream, *, own_deadline: bool = False) -> Method:
    return Method("server_stream", fn, own_deadline)


def client_stream(fn: ClientStream) -> Method:
    return Method("client_stream", fn)


def _media_type(request: Request) -> str:
    return request.header("content-type").split(";", 1)[0].strip().lower()


async def send_unary_error(response: Response, error: RpcError) -> None:
    await response.send_json(error.http_status, error.to_json())


async def serve(
    method: Method,
    request: Request,
    response: Response,
    make_call: Callable[[], Call],
) -> None:
    """Answer one Connect request with ``method``; ``make_call`` resolves the user (may raise)."""
    if request.method != "POST":
        await response.send(405, b"", headers=[("Allow", "POST")])
        return
    media = _media_type(request)
    if method.kind == "unary":
        if media != UNARY_CONTENT_TYPE:
            await response.send(415, b"", headers=[("Accept-Post", UNARY_CONTENT_TYPE)])
            return
        await _serve_unary(method, request, response, make_call)
        return
    if media != STREAM_CONTENT_TYPE:
        await response.send(415, b"", headers=[("Accept-Post", STREAM_CONTENT_TYPE)])
        return
    if method.kind == "server_stream":
        await _serve_server_stream(method, request, response, make_call)
    else:
        await _serve_client_stream(method, request, response, make_call)


async def _serve_unary(method: Method, request: Request, response: Response, make_call: Callable[[], Call]) -> None:
    try:
        encoding = request.header("content-encoding", "identity").lower()
        if encoding not in ("", "identity"):
            raise RpcError("unimplemented", f"unsupported content encoding {encoding!r}")
        call = make_call()
        try:
            raw = await request.body.read_all(MAX_MESSAGE_BYTES)
        except BodyTooLarge as exc:
            raise RpcError("resource_exhausted", str(exc)) from None
        msg = _decode(raw)
        fn: Unary = method.fn
        if call.timeout_s is not None:
            async with asyncio.timeout(call.timeout_s):
                reply = await fn(call, msg)
        else:
            reply = await fn(call, msg)
    except RpcError as exc:
        await send_unary_error(response, exc)
        return
    except TimeoutError:
        await send_unary_error(response, RpcError("deadline_exceeded", "the call's deadline passed"))
        return
    await response.send(200, dumps(reply), content_type=UNARY_CONTENT_TYPE)


def _decode(raw: bytes) -> Message:
    if not raw.strip():
        return {}
    try:
        msg = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise RpcError("invalid_argument", "request is not valid JSON") from None
    if not isinstance(msg, dict):
        raise RpcError("invalid_argument", "request must be a JSON object")
    return msg


async def _read_envelopes(request: Request) -> AsyncIterator[Message]:
    """The messages of a streamed request body, in order, until the body ends."""
    buf = bytearray()
    body = request.body
    while True:
        while len(buf) < 5:
            data = await body.read()
            if not data:
                if buf:
                    raise RpcError("invalid_argument", "truncated envelope")
                return
            buf += data
        flags, length = struct.unpack_from(">BI", buf)
        if length > MAX_MESSAGE_BYTES:
            raise RpcError("resource_exhausted", f"message larger than {MAX_MESSAGE_BYTES} bytes")
        while len(buf) < 5 + length:
            data = await body.read()
            if not data:
                raise RpcError("invalid_argument", "truncated envelope")
            buf += data
        payload = bytes(buf[5 : 5 + length])
        del buf[: 5 + length]
        if flags & FLAG_COMPRESSED:
            raise RpcError("internal", "compressed messages are not supported (identity only)")
        if flags & FLAG_END_STREAM:
            continue
        yield _decode(payload)


class _StreamWriter:
    """Writes envelopes of a streamed response, sending the head with the first one."""

    def __init__(self, response: Response) -> None:
        self.response = response

    async def _ensure_started(self) -> None:
        if not self.response.started:
            await self.response.start(200, [("Content-Type", STREAM_CONTENT_TYPE)])

    async def message(self, msg: Message | bytes) -> None:
        await self._ensure_started()
        payload = msg if isinstance(msg, bytes) else dumps(msg)
        await self.response.write(envelope(payload))

    async def finish(self, error: RpcError | None) -> None:
        await self._ensure_started()
        await self.response.write(end_stream(error))
        await self.response.end()


def _stream_error(exc: BaseException) -> RpcError:
    if isinstance(exc, RpcError):
        return exc
    if isinstance(exc, TimeoutError):
        return RpcError("deadline_exceeded", "the call's deadline passed")
    log.error("stream handler failed", exc_info=exc)
    return RpcError("internal", f"{type(exc).__name__}: {exc}")


async def _serve_server_stream(
    method: Method, request: Request, response: Response, make_call: Callable[[], Call]
) -> None:
    out = _StreamWriter(response)
    envelopes = _read_envelopes(request)
    try:
        call = make_call()
        # Start on the first message: clients write the terminating chunk separately, and with
        # Nagle on their side it only leaves after our delayed ACK (40 ms on every command).
        msg: Message | None = await anext(envelopes, None)
        if msg is None:
            raise RpcError("invalid_argument", "a server-stream call needs one request message")
    except RpcError as exc:
        async for _ in envelopes:
            pass
        await out.finish(exc)
        return

    async def rest_then_peer_closed() -> None:
        async for _ in envelopes:  # a server-stream request has one message; extras are ignored
            pass
        await request.conn.wait_peer_closed()

    async def pump() -> RpcError | None:
        fn: ServerStream = method.fn
        stream = fn(call, msg)
        try:
            if call.timeout_s is not None and not method.own_deadline:
                async with asyncio.timeout(call.timeout_s):
                    await _pump(stream, out)
            else:
                await _pump(stream, out)
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as exc:
            return _stream_error(exc)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        return None

    # The stream stops when the client leaves (the process it watches does not).
    pump_task = asyncio.ensure_future(pump())
    gone_task = asyncio.ensure_future(rest_then_peer_closed())
    try:
        await asyncio.wait({pump_task, gone_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        client_left = not pump_task.done()
        for task in (gone_task, pump_task):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task
    if client_left:
        response.keep_alive = False
        raise ConnectionError("client closed the stream")
    await out.finish(pump_task.result())


async def _pump(stream: AsyncIterator[Any], out: _StreamWriter) -> None:
    async for item in stream:
        await out.message(item)


async def _serve_client_stream(
    method: Method, request: Request, response: Response, make_call: Callable[[], Call]
) -> None:
    out = _StreamWriter(response)
    try:
        call = make_call()
        fn: ClientStream = method.fn
        if call.timeout_s is not None:
            async with asyncio.timeout(call.timeout_s):
                reply = await fn(call, _read_envelopes(request))
        else:
            reply = await fn(call, _read_envelopes(request))
    except (ConnectionError, asyncio.CancelledError):
        raise
    except Exception as exc:
        await out.finish(_stream_error(exc))
        return
    await out.message(reply)
    await out.finish(None)

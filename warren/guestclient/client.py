"""A host-side client of the guest agent for builds and start commands: health, /init, processes, files.

It speaks what the E2B SDK speaks (Connect JSON ``process.Process/Start`` over HTTP/1.1, ``POST
/files``), so a build step runs exactly like ``sandbox.commands.run``. Sockets close with a reset
(SO_LINGER 0): a connection the agent closed first would linger in gVisor's netstack and fail the
next checkpoint (guest-agent-notes B3).

    async with AgentClient(address, port, access_token=token) as agent:
        await agent.wait_healthy(deadline)
        result = await agent.run(["/bin/sh", "-c", "echo hi"], user="root", on_output=print)
        pid = await agent.start(["/bin/bash", "-l", "-c", "server"])      # keeps running after we leave
"""

from __future__ import annotations

import base64
import json
import socket
import struct
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import httpx

from warren.errors import RuntimeFailure
from warren.guestclient.wire import RESET_ON_CLOSE, init_agent, wait_healthy

STREAM_CONTENT_TYPE = "application/connect+json"
_END_STREAM = 0x02
MAX_CAPTURE = 64 << 10
"""Bytes of stdout/stderr a ``run`` keeps for its result (all of it still goes to ``on_output``)."""

OutputCallback = Callable[[str, bytes], None]
"""Called with ("stdout" | "stderr", bytes) for every chunk of output."""


class AgentError(RuntimeFailure):
    """The agent refused a call, or answered something that is not the protocol."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ProcessResult:
    pid: int
    exit_code: int
    stdout: bytes
    stderr: bytes
    error: str | None = None
    """The agent's reason when the process did not just exit (killed by a signal, timed out)."""
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def output_tail(self, limit: int = 500) -> str:
        text = (self.stderr or self.stdout).decode(errors="replace").strip()
        return text[-limit:]


def envelope(message: Mapping[str, Any], flags: int = 0) -> bytes:
    payload = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


async def read_envelopes(chunks: AsyncIterator[bytes]) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """(flags, message) for every envelope of a Connect stream body."""
    buf = b""
    async for chunk in chunks:
        buf += chunk
        while len(buf) >= 5:
            flags, size = struct.unpack(">BI", buf[:5])
            if len(buf) < 5 + size:
                break
            raw, buf = buf[5 : 5 + size], buf[5 + size :]
            try:
                message = json.loads(raw) if raw else {}
            except ValueError as exc:
                raise AgentError(f"the agent sent a malformed stream message: {exc}") from exc
            yield flags, message if isinstance(message, dict) else {}
    if buf:
        raise AgentError("the agent's stream ended inside a message")


def basic_user(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:".encode()).decode()


def process_message(
    argv: Sequence[str], *, cwd: str | None, envs: Mapping[str, str] | None
) -> dict[str, Any]:
    process: dict[str, Any] = {"cmd": argv[0], "args": list(argv[1:])}
    if envs:
        process["envs"] = dict(envs)
    if cwd:
        process["cwd"] = cwd
    return {"process": process, "stdin": False}


class AgentClient:
    def __init__(self, address: str, port: int, *, access_token: str | None = None, timeout_s: float = 30.0) -> None:
        self.base = f"http://{address}:{port}"
        self._address, self._port = address, port
        self._token = access_token
        transport = httpx.AsyncHTTPTransport(
            socket_options=[(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)], retries=0
        )
        self._http = httpx.AsyncClient(base_url=self.base, transport=transport, timeout=timeout_s)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def _headers(self, user: str | None) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self._token:
            headers["X-Access-Token"] = self._token
        if user:
            headers["Authorization"] = basic_user(user)
        return headers

    # ------------------------------------------------------------------ plain HTTP

    async def wait_healthy(self, deadline: float) -> None:
        """Poll ``GET /health`` until 2xx; ``deadline`` is ``time.monotonic()`` based."""
        await wait_healthy(self._address, self._port, deadline)

    async def init(
        self,
        *,
        env_vars: Mapping[str, str] | None = None,
        access_token: str | None = None,
        default_user: str | None = None,
        default_workdir: str | None = None,
    ) -> None:
        """``POST /init``; later calls carry ``access_token``."""
        await init_agent(self._address, self._port, env_vars=env_vars or {}, access_token=access_token,
                         default_user=default_user, default_workdir=default_workdir,
                         previous_token=self._token)  # fmt: skip
        if access_token:
            self._token = access_token

    async def write_file(self, path: str, data: bytes | AsyncIterator[bytes], *, user: str = "root") -> None:
        """``POST /files`` as octet-stream: creates parent directories, replaces an existing file."""
        headers = {**self._headers(None), "Content-Type": "application/octet-stream"}
        r = await self._post("/files", params={"path": path, "username": user}, content=data, headers=headers,
                             timeout=None)  # fmt: skip
        if not r.is_success:
            raise AgentError(f"writing {path} in the sandbox failed: {r.status_code} {_message(r)}")

    async def _post(self, url: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._http.post(url, **kwargs)
        except httpx.HTTPError as exc:
            raise AgentError(f"the guest agent at {self.base} failed: {exc!r}") from exc

    # ------------------------------------------------------------------ processes

    async def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        cwd: str | None = None,
        envs: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        on_output: OutputCallback | None = None,
        on_start: Callable[[int], None] | None = None,
    ) -> ProcessResult:
        """Run a process to its end. A timeout kills it (agent side) and sets ``timed_out``.
        ``on_start(pid)`` is called once the agent started it."""
        headers = self._stream_headers(user, timeout_s)
        out: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        pid = 0
        try:
            async with self._http.stream(
                "POST", "/process.Process/Start", content=envelope(process_message(argv, cwd=cwd, envs=envs)),
                headers=headers, timeout=httpx.Timeout(30.0, read=None),
            ) as response:  # fmt: skip
                await _check_stream_response(response)
                async for flags, message in read_envelopes(response.aiter_bytes()):
                    if flags & _END_STREAM:
                        error = message.get("error")
                        if isinstance(error, dict):
                            code = str(error.get("code", ""))
                            if code == "deadline_exceeded":
                                return ProcessResult(pid, -1, bytes(out["stdout"]), bytes(out["stderr"]),
                                                     str(error.get("message", "")), timed_out=True)  # fmt: skip
                            raise AgentError(f"{code}: {error.get('message', '')}", code)
                        break
                    event = message.get("event") or {}
                    if "start" in event:
                        pid = int(event["start"].get("pid", 0))
                        if on_start is not None:
                            on_start(pid)
                    elif "data" in event:
                        for stream, raw in event["data"].items():
                            if stream not in ("stdout", "stderr", "pty"):
                                continue
                            chunk = base64.b64decode(raw)
                            name = "stderr" if stream == "stderr" else "stdout"
                            if on_output is not None:
                                on_output(name, chunk)
                            if len(out[name]) < MAX_CAPTURE:
                                out[name] += chunk[: MAX_CAPTURE - len(out[name])]
                    elif "end" in event:
                        end = event["end"]
                        return ProcessResult(
                            pid,
                            int(end.get("exitCode", 0)),
                            bytes(out["stdout"]),
                            bytes(out["stderr"]),
                            end.get("error") or (None if end.get("exited", True) else str(end.get("status"))),
                        )
        except httpx.HTTPError as exc:
            raise AgentError(f"running {argv[0]} through the guest agent failed: {exc!r}") from exc
        raise AgentError(f"the agent ended the stream of {argv[0]} without an end event")

    async def start(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        cwd: str | None = None,
        envs: Mapping[str, str] | None = None,
    ) -> int:
        """Start a background process and return its pid; it keeps running when this call returns."""
        try:
            async with self._http.stream(
                "POST", "/process.Process/Start", content=envelope(process_message(argv, cwd=cwd, envs=envs)),
                headers=self._stream_headers(user, None), timeout=httpx.Timeout(30.0),
            ) as response:  # fmt: skip
                await _check_stream_response(response)
                async for flags, message in read_envelopes(response.aiter_bytes()):
                    if flags & _END_STREAM:
                        error = message.get("error") or {}
                        raise AgentError(f"{error.get('code', 'unknown')}: {error.get('message', '')}",
                                         error.get("code"))  # fmt: skip
                    start = (message.get("event") or {}).get("start")
                    if start is not None:
                        return int(start.get("pid", 0))
        except httpx.HTTPError as exc:
            raise AgentError(f"starting {argv[0]} through the guest agent failed: {exc!r}") from exc
        raise AgentError(f"the agent did not report the start of {argv[0]}")

    def _stream_headers(self, user: str | None, timeout_s: float | None) -> dict[str, str]:
        headers = {
            **self._headers(user),
            "Content-Type": STREAM_CONTENT_TYPE,
            "Connect-Protocol-Version": "1",
            "Keepalive-Ping-Interval": "30",
        }
        if timeout_s is not None:
            headers["Connect-Timeout-Ms"] = str(int(timeout_s * 1000))
        return headers


async def _check_stream_response(response: httpx.Response) -> None:
    if response.status_code == 200:
        return
    await response.aread()
    try:
        body = response.json()
    except ValueError:
        body = {}
    code = body.get("code") if isinstance(body, dict) else None
    message = body.get("message") if isinstance(body, dict) else None
    raise AgentError(f"{code or response.status_code}: {message or response.text[:200]}", str(code) if code else None)


def _message(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text[:200]
    return str(body.get("message", body)) if isinstance(body, dict) else str(body)[:200]


__all__ = ["AgentClient", "AgentError", "OutputCallback", "ProcessResult", "envelope", "read_envelopes"]

"""In-memory stand-ins for unit tests that must run without root.

``FakeRuntime`` replaces runc/runsc (which need root, namespaces and cgroups) and
``FakeAgent`` replaces the guest agent with a tiny asyncio HTTP server on loopback that answers
``/health`` and ``/init``, so the orchestrator's real network code paths run.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from warren import treecopy
from warren.errors import NotFoundError, RuntimeFailure
from warren.runtime.base import (
    PauseMode,
    RuntimeKind,
    RuntimeProbe,
    RuntimeState,
    SandboxHandle,
    SandboxSpec,
    SandboxStats,
    SnapshotContents,
)
from warren.store import EgressPolicy


class FakeAgent:
    """Answers /health with 204 and records /init bodies."""

    def __init__(self) -> None:
        self.inits: list[dict[str, Any]] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length) if length else b""
        if head.startswith(b"POST /init"):
            self.inits.append(json.loads(body))
        writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()


class FakeRuntime:
    """Records starts and stops; every sandbox's agent is the one ``FakeAgent``."""

    def __init__(self, kind: RuntimeKind, agent: FakeAgent, *, available: bool = True) -> None:
        self.kind = kind
        self.agent = agent
        self.available = available
        self.running: dict[str, SandboxSpec] = {}
        self.stopped: list[str] = []
        self.fail_start = False
        self.restored_from: dict[str, str] = {}
        self.exported: Path | None = None
        self.egress: dict[str, EgressPolicy] = {}

    def probe(self) -> RuntimeProbe:
        return RuntimeProbe(self.available, "" if self.available else "fake: unavailable")

    async def start(self, spec: SandboxSpec) -> SandboxHandle:
        if self.fail_start:
            raise RuntimeFailure("fake start failure")
        self.running[spec.sandbox_id] = spec
        return SandboxHandle(spec.sandbox_id, self.kind, "127.0.0.1", agent_port=self.agent.port)

    async def stop(self, sandbox_id: str) -> None:
        self.running.pop(sandbox_id, None)
        self.stopped.append(sandbox_id)

    async def state(self, sandbox_id: str) -> RuntimeState | None:
        return RuntimeState.RUNNING if sandbox_id in self.running else None

    async def stats(self, sandbox_id: str) -> SandboxStats:
        if sandbox_id not in self.running:
            raise NotFoundError(sandbox_id)
        return SandboxStats(1, 10**9, 100, 1000, 10, 5, 50)

    async def pause(self, sandbox_id: str, mode: PauseMode) -> None:
        if sandbox_id not in self.running:
            raise NotFoundError(sandbox_id)

    async def resume(self, spec: SandboxSpec, mode: PauseMode) -> SandboxHandle:
        self.running[spec.sandbox_id] = spec
        return SandboxHandle(spec.sandbox_id, self.kind, "127.0.0.1", agent_port=self.agent.port)

    async def locate(self, sandbox_id: str) -> SandboxHandle | None:
        if sandbox_id not in self.running:
            return None
        return SandboxHandle(sandbox_id, self.kind, "127.0.0.1", agent_port=self.agent.port)

    async def export_filesystem(self, sandbox_id: str, dest: Path) -> None:
        """``exported`` (a tree to copy, set by the test) or one file naming the sandbox."""
        if sandbox_id not in self.running:
            raise NotFoundError(sandbox_id)
        if self.exported is not None:
            await treecopy.copy_tree(self.exported, dest)
            return
        await asyncio.to_thread(dest.mkdir)
        await asyncio.to_thread((dest / "from").write_text, sandbox_id)

    async def snapshot(self, sandbox_id: str, dest: Path) -> SnapshotContents:
        (dest / "upper").mkdir()
        (dest / "upper" / "from").write_text(sandbox_id)
        return SnapshotContents(memory=self.kind is RuntimeKind.GVISOR, runtime=self.kind, bytes=1)

    async def update_egress(self, sandbox_id: str, egress: EgressPolicy) -> None:
        self.egress[sandbox_id] = egress

    def egress_ca(self) -> bytes:
        return b"-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n"

    async def restore(self, spec: SandboxSpec, snapshot: Path) -> SandboxHandle:
        if not (snapshot / "upper").is_dir():
            raise RuntimeFailure("fake: no upper in snapshot")
        self.restored_from[spec.sandbox_id] = (snapshot / "upper" / "from").read_text()
        return await self.start(spec)


class SlowPauseRuntime(FakeRuntime):
    """Each pause takes ``pause_s`` of loop time (run under looptime: no wall time passes)."""

    def __init__(self, kind: RuntimeKind, agent: FakeAgent, pause_s: float, fail_first: int = 0) -> None:
        super().__init__(kind, agent)
        self.pause_s = pause_s
        self.paused: set[str] = set()
        self.in_flight = 0
        self.max_in_flight = 0
        self.fail_first = fail_first

    async def pause(self, sandbox_id: str, mode: PauseMode) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.pause_s)
            if self.fail_first > 0:
                self.fail_first -= 1
                raise RuntimeFailure("fake: pause failed once")
            self.paused.add(sandbox_id)
        finally:
            self.in_flight -= 1

    async def state(self, sandbox_id: str) -> RuntimeState | None:
        if sandbox_id in self.paused:
            return RuntimeState.PAUSED
        return await super().state(sandbox_id)

"""A build sandbox's life: started over the build's lower layers, its agent ready, always stopped.

Build sandboxes are runc sandboxes named ``bld…`` that the sandbox manager never lists; the node
reaps any a crash left (:mod:`warren.runtime.reaper`: they are never in the store).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from warren.errors import WarrenError
from warren.guestclient import AgentClient
from warren.ids import new_id
from warren.runtime.base import Resources, Runtime, RuntimeKind, RuntimeProbe, SandboxSpec
from warren.templates.buildlog import BuildLog
from warren.templates.model import BASE_STEP, DEFAULT_DISK_MB, SANDBOX_PREFIX, BuildFailed
from warren.templates.steps import ROOT

log = logging.getLogger(__name__)

AGENT_START_DEADLINE_S = 30.0
BUILD_MIN_MEMORY_MB = 1024
"""Build sandboxes get at least this much memory: package managers need more than a small template."""


@dataclass(frozen=True)
class BuildSandbox:
    sandbox_id: str
    agent: AgentClient


def new_sandbox_id() -> str:
    return new_id(SANDBOX_PREFIX)


@contextlib.asynccontextmanager
async def build_sandbox(
    runtime: Runtime | None, lower: Sequence[str], *, cpu_count: int, memory_mb: int, log_to: BuildLog
) -> AsyncIterator[BuildSandbox]:
    """Start a build sandbox over ``lower`` and wait for its agent; stop it on the way out, however left."""
    probe = runtime.probe() if runtime is not None else RuntimeProbe(False, "runc is not configured")
    if runtime is None or not probe.available:
        raise BuildFailed(f"cannot build: runc is not available on this node ({probe.reason})", BASE_STEP)
    sandbox_id = new_sandbox_id()
    spec = SandboxSpec(
        sandbox_id=sandbox_id,
        runtime=RuntimeKind.RUNC,
        layers=tuple(Path(p) for p in lower),
        resources=Resources(cpu_count=cpu_count, memory_mb=max(memory_mb, BUILD_MIN_MEMORY_MB),
                            disk_mb=DEFAULT_DISK_MB),
        allow_internet=True,
    )  # fmt: skip
    started = time.monotonic()
    try:
        try:
            handle = await runtime.start(spec)
        except WarrenError as exc:
            raise BuildFailed(f"cannot start the build sandbox: {exc}", BASE_STEP) from exc
        async with AgentClient(handle.address, handle.agent_port) as agent:
            try:
                await agent.wait_healthy(time.monotonic() + AGENT_START_DEADLINE_S)
                await agent.init(access_token=secrets.token_urlsafe(24), default_user=ROOT)
            except WarrenError as exc:
                raise BuildFailed(f"the build sandbox did not come up: {exc}", BASE_STEP) from exc
            log_to.add(f"Build sandbox {sandbox_id} ready in {time.monotonic() - started:.2f}s", step=BASE_STEP)
            yield BuildSandbox(sandbox_id, agent)
    finally:
        await asyncio.shield(_stop(runtime, sandbox_id))


async def _stop(runtime: Runtime, sandbox_id: str) -> None:
    try:
        await runtime.stop(sandbox_id)
    except WarrenError:
        log.exception("could not remove build sandbox %s (removed at the next start)", sandbox_id)


__all__ = ["AGENT_START_DEADLINE_S", "BUILD_MIN_MEMORY_MB", "BuildSandbox", "build_sandbox", "new_sandbox_id"]

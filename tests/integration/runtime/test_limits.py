"""cgroup limits: a memory bomb or a fork bomb is stopped; on runc the agent survives it.

gVisor 2022 has no OOM killer or pids controller of its own: the host cgroup limits the whole sandbox
(sentry + gofer), so exceeding them stops the sandbox as a whole. That is asserted as such.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.framework.agent import wait_for_health
from tests.framework.runtime import SandboxFactory, exec_in
from warren.runtime.base import Resources, RuntimeKind

pytestmark = [pytest.mark.root]

MEMORY_BOMB = """
chunks = []
while True:
    chunks.append(bytearray(16 * 1024 * 1024))
    print(len(chunks) * 16, flush=True)
"""

FORK_BOMB = """
import os, time
n = 0
try:
    while n < 10000:
        if os.fork() == 0:
            os.close(1)  # let exec return as soon as the parent is done
            os.close(2)
            time.sleep(5)
            os._exit(0)
        n += 1
except OSError as exc:
    print("fork failed after", n, exc.errno, flush=True)
"""

PYTHON = ["/.agent/bin/python3", "-S", "-E", "-c"]


async def _healthy(address: str, port: int) -> None:
    async with asyncio.timeout(20):
        await wait_for_health(address, port)


async def test_memory_bomb_is_oom_killed_and_the_agent_lives(runc_sandboxes: SandboxFactory) -> None:
    handle = await runc_sandboxes.start(resources=Resources(memory_mb=128))
    await _healthy(handle.address, handle.agent_port)
    result = await exec_in(runc_sandboxes.runtime, handle.sandbox_id, [*PYTHON, MEMORY_BOMB], check=False)
    assert result.returncode == 137  # SIGKILL from the OOM killer
    allocated = [int(x) for x in result.stdout_text.split()]
    assert 0 < max(allocated) <= 128
    await _healthy(handle.address, handle.agent_port)
    assert await runc_sandboxes.runtime.state(handle.sandbox_id) == "running"


async def test_fork_bomb_hits_the_pids_limit_and_the_agent_lives(runc_sandboxes: SandboxFactory) -> None:
    handle = await runc_sandboxes.start(resources=Resources(pids_max=64))
    await _healthy(handle.address, handle.agent_port)
    result = await exec_in(runc_sandboxes.runtime, handle.sandbox_id, [*PYTHON, FORK_BOMB])
    assert "fork failed after" in result.stdout_text
    assert int(result.stdout_text.split()[3]) < 64
    await _healthy(handle.address, handle.agent_port)


@pytest.mark.runsc
async def test_gvisor_memory_bomb_is_contained(runsc_sandboxes: SandboxFactory) -> None:
    bomb = await runsc_sandboxes.start(resources=Resources(memory_mb=192))
    other = await runsc_sandboxes.start()
    await _healthy(bomb.address, bomb.agent_port)
    result = await exec_in(runsc_sandboxes.runtime, bomb.sandbox_id, [*PYTHON, MEMORY_BOMB], check=False)
    assert result.returncode != 0
    allocated = [int(x) for x in result.stdout_text.split() if x.isdigit()]
    assert max(allocated, default=0) <= 192
    # The whole gVisor sandbox is stopped by the host OOM killer; its neighbour is not affected.
    assert await runsc_sandboxes.runtime.state(bomb.sandbox_id) == "stopped"
    await _healthy(other.address, other.agent_port)
    assert runsc_sandboxes.runtime.kind is RuntimeKind.GVISOR

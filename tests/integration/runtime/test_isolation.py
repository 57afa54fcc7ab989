"""A started sandbox answers at its address and is isolated from the host and from other sandboxes."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.framework.agent import wait_for_health
from tests.framework.runtime import SandboxFactory, exec_in
from warren.runtime.base import SandboxHandle

pytestmark = [pytest.mark.root]

HEALTH_DEADLINE = 20.0


async def _started(sandboxes: SandboxFactory, **overrides: object) -> SandboxHandle:
    handle = await sandboxes.start(**overrides)
    async with asyncio.timeout(HEALTH_DEADLINE):
        await wait_for_health(handle.address, handle.agent_port)
    return handle


async def _sh(sandboxes: SandboxFactory, handle: SandboxHandle, script: str, *, check: bool = True) -> str:
    result = await exec_in(sandboxes.runtime, handle.sandbox_id, ["/bin/sh", "-c", script], check=check)
    return result.stdout_text


@contextlib.contextmanager
def _host_listener() -> Iterator[int]:
    """A TCP service on 0.0.0.0 of the host (all host addresses, including the veth ends)."""
    with socket.socket() as srv:
        srv.bind(("0.0.0.0", 0))
        srv.listen()
        yield int(srv.getsockname()[1])


async def test_agent_answers_and_hostname_is_the_id(sandboxes: SandboxFactory) -> None:
    handle = await _started(sandboxes)
    assert await _sh(sandboxes, handle, "hostname") == f"{handle.sandbox_id}\n"
    assert await sandboxes.runtime.state(handle.sandbox_id) == "running"
    hosts = await _sh(sandboxes, handle, "cat /etc/hosts")
    assert f"{handle.address}\t{handle.sandbox_id}" in hosts
    assert "nameserver" in await _sh(sandboxes, handle, "cat /etc/resolv.conf")


async def test_processes_are_isolated(sandboxes: SandboxFactory) -> None:
    handle = await _started(sandboxes)
    out = await _sh(sandboxes, handle, "ps -o pid,args")
    commands = [line.split(None, 1)[1] for line in out.splitlines()[1:] if line.strip()]
    assert any("/.agent/agent.py" in c for c in commands), out
    # Only the agent, the shell and ps itself: nothing from the host.
    assert len(commands) <= 3, out
    assert "pytest" not in out


async def test_agent_bundle_is_read_only_and_host_files_are_invisible(
    sandboxes: SandboxFactory, tmp_path: Path
) -> None:
    marker = tmp_path / "host-file"
    marker.write_text("TOKEN-4711")
    handle = await _started(sandboxes)
    out = await _sh(sandboxes, handle, "touch /.agent/x 2>&1; echo rc=$?", check=False)
    assert "rc=1" in out and "Read-only" in out
    out = await _sh(sandboxes, handle, f"cat {marker} 2>&1; ls /work /root/.pyenv 2>&1; echo done")
    assert "TOKEN-4711" not in out and "done" in out
    assert "No such file" in out
    # The sandbox's own writes land in its overlay, not in the shared layer.
    await _sh(sandboxes, handle, "echo mine > /etc/written-in-sandbox")
    assert not (sandboxes.layers[0] / "etc" / "written-in-sandbox").exists()
    upper = sandboxes.runtime.sandbox_paths(handle.sandbox_id).upper
    assert (upper / "etc" / "written-in-sandbox").read_text() == "mine\n"


async def test_cannot_reach_host_services(sandboxes: SandboxFactory) -> None:
    handle = await _started(sandboxes)
    record = sandboxes.runtime.sandbox_paths(handle.sandbox_id)
    assert record.root.is_dir()
    host_ip = handle.address.rsplit(".", 1)[0] + "." + str(int(handle.address.rsplit(".", 1)[1]) - 1)
    with _host_listener() as port:
        # The service is reachable from the host itself (the listener works) ...
        with socket.create_connection((host_ip, port), timeout=2):
            pass
        # ... but not from the sandbox, on the veth address nor on any other host address.
        targets = [host_ip, *_host_addresses()]
        script = "; ".join(f"nc -w 2 {ip} {port} </dev/null && echo OPEN-{ip}" for ip in targets)
        out = await _sh(sandboxes, handle, script + "; echo done", check=False)
    assert "OPEN" not in out, out


def _host_addresses() -> list[str]:
    """The host's non-loopback IPv4 addresses outside the test pool."""
    import json
    import subprocess

    data = json.loads(subprocess.run(["ip", "-4", "-json", "addr"], capture_output=True, check=True).stdout)
    return [a["local"] for link in data for a in link.get("addr_info", [])
            if not a["local"].startswith(("127.", "10.78."))]


async def test_cannot_reach_another_sandbox(sandboxes: SandboxFactory) -> None:
    first = await _started(sandboxes)
    second = await _started(sandboxes)
    script = f"nc -w 2 {second.address} {second.agent_port} </dev/null && echo OPEN; echo done"
    out = await _sh(sandboxes, first, script, check=False)
    assert "OPEN" not in out, out
    # The host still reaches both.
    async with asyncio.timeout(HEALTH_DEADLINE):
        await wait_for_health(second.address, second.agent_port)
        await wait_for_health(first.address, first.agent_port)


async def test_stats_read_the_cgroup_and_upper_dir(sandboxes: SandboxFactory) -> None:
    handle = await _started(sandboxes)
    await _sh(sandboxes, handle, "dd if=/dev/zero of=/root/blob bs=1024 count=2048 2>/dev/null")
    stats = await sandboxes.runtime.stats(handle.sandbox_id)
    assert stats.cpu_usage_ns > 0
    assert 0 < stats.memory_used < stats.memory_total == 512 * 1024 * 1024
    assert stats.disk_used >= 2 * 1024 * 1024
    assert stats.disk_total == 2048 * 1024 * 1024

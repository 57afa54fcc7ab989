"""Egress NAT, per-sandbox no-internet, blocked ranges, and the nft table's lifecycle.

"The internet" is simulated by a namespace we create ("outside", 198.18.0.2, a benchmarking range that
is not blocked) behind a veth from the host, so no packet leaves the machine. The same namespace also
answers on 192.168.250.2, a private address that sandboxes must not reach.
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
from collections.abc import Iterator

import pytest

import warren.runtime.net.manager as manager_module
from tests.framework.agent import wait_for_health
from tests.framework.runtime import TEST_NET_CONFIG, SandboxFactory, exec_in
from warren.runtime.net.manager import NetworkManager
from warren.runtime.net.netns import link_exists
from warren.runtime.oci.command import run_command

pytestmark = [pytest.mark.root]

OUTSIDE_IP = "198.18.0.2"
OUTSIDE_HOST_IP = "198.18.0.1"
PRIVATE_IP = "192.168.250.2"
PORT = 8080

_SERVER = f"""
import socket
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", {PORT}))
srv.listen()
print("ready", flush=True)
while True:
    conn, peer = srv.accept()
    conn.sendall(("peer=" + peer[0] + "\\n").encode())
    conn.close()
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def outside(test_network: NetworkManager) -> Iterator[str]:
    """A server namespace reachable from the host only through routing (created after nft setup)."""
    token = secrets.token_hex(3)
    ns, host_if = f"wrt-out{token}", f"wno{token}"
    _ip("netns", "add", ns)
    server = None
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("addr", "add", f"{OUTSIDE_HOST_IP}/30", "dev", host_if)
        _ip("addr", "add", "192.168.250.1/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", ns, "addr", "add", f"{OUTSIDE_IP}/30", "dev", "eth0")
        _ip("-n", ns, "addr", "add", f"{PRIVATE_IP}/30", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-S", "-c", _SERVER],
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield ns
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        _ip("netns", "del", ns)


async def _nft(*args: str) -> str:
    return (await run_command(["nft", *args], timeout=10)).stdout_text


async def _connect(sandboxes: SandboxFactory, sandbox_id: str, ip: str) -> str:
    script = f"nc -w 3 {ip} {PORT} </dev/null || echo FAILED"
    result = await exec_in(sandboxes.runtime, sandbox_id, ["/bin/sh", "-c", script])
    return result.stdout_text.strip()


async def test_egress_is_masqueraded(sandboxes: SandboxFactory, outside: str) -> None:
    handle = await sandboxes.start()
    async with asyncio.timeout(20):
        await wait_for_health(handle.address, handle.agent_port)
    # The outside world sees the host's address, not the sandbox's.
    assert await _connect(sandboxes, handle.sandbox_id, OUTSIDE_IP) == f"peer={OUTSIDE_HOST_IP}"


async def test_no_internet_blocks_egress_but_not_the_agent(sandboxes: SandboxFactory, outside: str) -> None:
    handle = await sandboxes.start(allow_internet=False)
    async with asyncio.timeout(20):
        await wait_for_health(handle.address, handle.agent_port)
    assert await _connect(sandboxes, handle.sandbox_id, OUTSIDE_IP) == "FAILED"


async def test_private_ranges_are_blocked(runc_sandboxes: SandboxFactory, outside: str) -> None:
    handle = await runc_sandboxes.start()
    assert await _connect(runc_sandboxes, handle.sandbox_id, PRIVATE_IP) == "FAILED"
    assert await _connect(runc_sandboxes, handle.sandbox_id, OUTSIDE_IP) == f"peer={OUTSIDE_HOST_IP}"


async def test_setup_is_idempotent_and_keeps_no_internet_members(test_network: NetworkManager) -> None:
    net = await test_network.create("nftcheck", allow_internet=False)
    try:
        await test_network.setup()
        assert f'"{net.host_if}"' in await _nft("list", "set", "inet", TEST_NET_CONFIG.table, "no_internet")
    finally:
        await test_network.destroy(net)
    assert f'"{net.host_if}"' not in await _nft("list", "set", "inet", TEST_NET_CONFIG.table, "no_internet")


async def test_teardown_removes_only_our_table(test_network: NetworkManager) -> None:
    await _nft("add", "table", "inet", "warren_test_bystander")
    try:
        await test_network.teardown()
        tables = await _nft("list", "tables")
        assert f"inet {TEST_NET_CONFIG.table}\n" not in tables
        assert "inet warren_test_bystander" in tables
        await test_network.teardown()  # idempotent
    finally:
        await _nft("delete", "table", "inet", "warren_test_bystander")


async def test_pool_skips_a_slot_whose_veth_still_exists(test_network: NetworkManager) -> None:
    first = await test_network.create("slotcheck1")
    await test_network.destroy(first)
    # The next round-robin slot is first.slot + 1; occupy its interface name behind the pool's back.
    squatter = f"{TEST_NET_CONFIG.veth_prefix}{first.slot + 1}"
    _ip("link", "add", squatter, "type", "veth", "peer", "name", f"sq{secrets.token_hex(3)}")
    try:
        second = await test_network.create("slotcheck2")
        try:
            assert second.slot == first.slot + 2
            assert link_exists(second.host_if)
        finally:
            await test_network.destroy(second)
    finally:
        _ip("link", "del", squatter)


async def test_a_slot_taken_between_look_and_add_is_left_to_its_owner(
    test_network: NetworkManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two nodes on one host: the other one adds the veth of the slot we picked after we looked. We
    must move on to the next slot and never delete the other node's veth (the race is forced by
    making the first look miss the squatter)."""
    first = await test_network.create("racecheck1")
    await test_network.destroy(first)
    squatter = f"{TEST_NET_CONFIG.veth_prefix}{first.slot + 1}"
    _ip("link", "add", squatter, "type", "veth", "peer", "name", f"sq{secrets.token_hex(3)}")
    looks = {"missed": False}
    real = manager_module.link_exists

    def blind_once(name: str) -> bool:
        if name == squatter and not looks["missed"]:
            looks["missed"] = True
            return False
        return real(name)

    monkeypatch.setattr(manager_module, "link_exists", blind_once)
    try:
        second = await test_network.create("racecheck2")
        try:
            assert looks["missed"] and second.slot != first.slot + 1
            assert real(squatter), "the other process's veth was deleted"
        finally:
            await test_network.destroy(second)
    finally:
        _ip("link", "del", squatter)

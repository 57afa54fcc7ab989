"""The always-denied egress sets as the kernel holds them after a real ``nft -f`` of warren's table.

A connection test to these addresses would need a host route to them, which on a cloud host would
hijack its own metadata service for the test's duration; the set lookups below are what the forward
chain's drop rules consult.
"""

from __future__ import annotations

import pytest

from warren.runtime.net.manager import NetworkManager
from warren.runtime.oci.command import run_command

pytestmark = [pytest.mark.root]


async def _has_element(table: str, set_name: str, addr: str) -> bool:
    result = await run_command(
        ["nft", "get", "element", "inet", table, set_name, f"{{ {addr} }}"], timeout=10, check=False
    )
    return result.returncode == 0


@pytest.mark.parametrize("addr", ["169.254.169.254", "168.63.129.16", "100.100.100.200"])
async def test_v4_metadata_addresses_are_in_the_drop_set(test_network: NetworkManager, addr: str) -> None:
    assert await _has_element(test_network.config.table, "blocked", addr)


@pytest.mark.parametrize("addr", ["fd00:ec2::254", "fd20:ce::254", "fe80::1"])
async def test_v6_metadata_addresses_are_in_the_drop_set(test_network: NetworkManager, addr: str) -> None:
    assert await _has_element(test_network.config.table, "blocked6", addr)


async def test_a_public_address_is_in_neither(test_network: NetworkManager) -> None:
    assert not await _has_element(test_network.config.table, "blocked", "198.18.0.2")
    assert not await _has_element(test_network.config.table, "blocked6", "2001:db8::1")


async def test_forward_chain_drops_v6_to_the_set(test_network: NetworkManager) -> None:
    listing = await run_command(["nft", "list", "chain", "inet", test_network.config.table, "forward"], timeout=10)
    assert "ip6 daddr @blocked6 drop" in listing.stdout_text

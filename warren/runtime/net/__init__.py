"""Sandbox networking: per-sandbox netns + veth from a /30 pool, NAT egress and isolation in nftables."""

from warren.runtime.net.manager import NetConfig, NetworkManager, SandboxNetwork, host_nameservers
from warren.runtime.net.pool import AddressPool, Slot

__all__ = ["AddressPool", "NetConfig", "NetworkManager", "SandboxNetwork", "Slot", "host_nameservers"]

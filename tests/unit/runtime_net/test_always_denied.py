"""The always-denied egress set: cloud metadata endpoints, whatever ``blocked_cidrs`` a node configures (pure)."""

from __future__ import annotations

import ipaddress

import pytest

from warren.runtime.net.nat import ALWAYS_DENIED, ALWAYS_DENIED_V6, NatRules

METADATA_V4 = ["169.254.169.254", "168.63.129.16", "100.100.100.200"]
METADATA_V6 = ["fd00:ec2::254", "fd20:ce::254"]


def _covered(addr: str, nets: tuple[str, ...] | list[str]) -> bool:
    ip = ipaddress.ip_address(addr)
    return any(ip in ipaddress.ip_network(n) for n in nets if ipaddress.ip_network(n).version == ip.version)


@pytest.mark.parametrize("addr", METADATA_V4)
def test_v4_metadata_addresses_are_always_denied(addr: str) -> None:
    assert _covered(addr, ALWAYS_DENIED)


@pytest.mark.parametrize("addr", METADATA_V6)
def test_v6_metadata_addresses_are_always_denied(addr: str) -> None:
    assert _covered(addr, ALWAYS_DENIED_V6)


def _rules() -> NatRules:
    return NatRules("warren", ipaddress.IPv4Network("10.77.0.0/16"), "wv")


def test_script_denies_them_even_with_an_empty_blocked_list() -> None:
    script = _rules()._script(["10.255.255.53"], [])
    elements = next(line for line in script.splitlines() if line.startswith("add element inet warren blocked "))
    for net in ALWAYS_DENIED:
        assert net in elements
    v6 = next(line for line in script.splitlines() if line.startswith("add element inet warren blocked6 "))
    for net in ALWAYS_DENIED_V6:
        assert net in v6
    assert "add set inet warren blocked6 { type ipv6_addr; flags interval; auto-merge; }" in script


def test_v6_rules_drop_before_anything_is_accepted() -> None:
    lines = [line for line in _rules()._script([], ["10.0.0.0/8"]).splitlines() if " forward " in line]
    denied = lines.index('add rule inet warren forward iifname "wv*" ip6 daddr @blocked6 drop')
    all_v6 = lines.index('add rule inet warren forward iifname "wv*" meta nfproto ipv6 drop')
    dns = next(i for i, line in enumerate(lines) if "th dport 53 accept" in line)
    assert denied < dns and all_v6 < dns

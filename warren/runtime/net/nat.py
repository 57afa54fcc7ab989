"""warren's nftables rules: NAT egress for the pool, isolation of the host and of sandboxes.

Everything lives in one table of ours (``table inet <name>``); no other rule on the host is touched.
:meth:`NatRules.setup` (re)writes the chains in one atomic ``nft -f`` transaction and is idempotent;
it keeps the members of the ``no_internet`` set, so running sandboxes keep their setting.

What the rules enforce, for traffic from a sandbox veth (``<veth_prefix>*``):

* prerouting: a source address that does not route back through the incoming veth is dropped
  (anti-spoofing; sandboxes have CAP_NET_RAW);
* input (anything addressed to the host itself, on any host address): only replies to connections the
  host opened (the agent) and ICMP pass;
* nat prerouting (``egress_pre``) and the end of forward: the sandbox's own egress chains, if it has
  an egress policy (``egress_nft.py``); redirected connections to the egress proxy pass input;
* forward: nothing is routed *into* a sandbox except replies, so sandbox -> sandbox is dropped; a
  sandbox in ``no_internet`` is dropped; IPv6 is dropped; DNS to the resolvers we hand out passes;
  private, link-local, CGNAT and the host's own subnets are dropped; the rest is masqueraded out.

Cloud metadata endpoints (:data:`ALWAYS_DENIED`, :data:`ALWAYS_DENIED_V6`) are in the drop sets whatever
``blocked`` a node is configured with. Sandboxes get no IPv6 address or route (the netns is IPv4
only) and all their IPv6 is dropped; the ``blocked6`` set names the IPv6 metadata addresses anyway,
so they stay denied if IPv6 egress is ever allowed.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from warren.errors import RuntimeFailure
from warren.runtime.oci.command import run_command

__all__ = ["ALWAYS_DENIED", "ALWAYS_DENIED_V6", "DEFAULT_BLOCKED", "NatRules", "host_subnets"]

NFT_TIMEOUT = 15.0

DEFAULT_BLOCKED = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16",
    "224.0.0.0/3",
)
"""Destinations a sandbox never reaches: RFC 1918, CGNAT, link-local (cloud metadata), multicast/reserved."""

ALWAYS_DENIED = ("169.254.169.254/32", "168.63.129.16/32", "100.100.100.200/32")
"""Cloud metadata and host-agent endpoints, denied even if ``blocked`` leaves out their ranges: AWS/GCP/
Azure/OpenStack IMDS (169.254.169.254), Azure WireServer (168.63.129.16), Alibaba Cloud (100.100.100.200)."""
ALWAYS_DENIED_V6 = ("fd00:ec2::254/128", "fd20:ce::254/128", "fc00::/7", "fe80::/10")
"""IPv6: AWS IMDS (fd00:ec2::254), GCP metadata (fd20:ce::254), and the unique-local and link-local ranges."""

_IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


def _set_ip_forward(value: str) -> str:
    """Write ``net.ipv4.ip_forward``; return the previous value."""
    previous = _IP_FORWARD.read_text().strip()
    if previous != value:
        _IP_FORWARD.write_text(value + "\n")
    return previous


async def host_subnets(exclude: ipaddress.IPv4Network) -> list[str]:
    """The IPv4 networks the host is directly attached to (except loopback and ``exclude``)."""
    result = await run_command(["ip", "-4", "-json", "addr", "show"], timeout=NFT_TIMEOUT)
    nets: list[str] = []
    for link in json.loads(result.stdout or b"[]"):
        for addr in link.get("addr_info", []):
            net = ipaddress.IPv4Network(f"{addr['local']}/{addr['prefixlen']}", strict=False)
            if not net.is_loopback and not net.overlaps(exclude):
                nets.append(str(net))
    return sorted(set(nets))


class NatRules:
    """The ``inet <table>`` ruleset for one address pool."""

    def __init__(self, table: str, pool: ipaddress.IPv4Network, veth_prefix: str) -> None:
        self.table = table
        self.pool = pool
        self.veth_glob = f"{veth_prefix}*"
        self._saved_ip_forward: str | None = None

    def _script(self, dns: Sequence[str], blocked: Iterable[str]) -> str:
        t = f"inet {self.table}"
        v = f'"{self.veth_glob}"'
        blocked_elems = ", ".join(sorted({*blocked, *ALWAYS_DENIED}))
        lines = [
            f"add table {t}",
            f"add set {t} no_internet {{ type ifname; }}",
            # Not flushed: nodes sharing the table (tests, several nodes on a host) each add their resolvers.
            f"add set {t} dns {{ type ipv4_addr; }}",
            f"add set {t} blocked {{ type ipv4_addr; flags interval; auto-merge; }}",
            f"flush set {t} blocked",
            f"add set {t} blocked6 {{ type ipv6_addr; flags interval; auto-merge; }}",
            f"flush set {t} blocked6",
            f"add element {t} blocked6 {{ {', '.join(ALWAYS_DENIED_V6)} }}",
            # Per-sandbox egress chains (egress_nft.py) hang off these maps, keyed by veth; kept across setups.
            f"add map {t} egress_fwd {{ type ifname : verdict; }}",
            f"add map {t} egress_nat {{ type ifname : verdict; }}",
        ]
        if dns:
            lines.append(f"add element {t} dns {{ {', '.join(dns)} }}")
        if blocked_elems:
            lines.append(f"add element {t} blocked {{ {blocked_elems} }}")
        chains = {
            "prerouting": ("type filter hook prerouting priority -160; policy accept;", [
                f"iifname {v} fib saddr . iif oif missing drop",
            ]),
            "input": ("type filter hook input priority -10; policy accept;", [
                f"iifname {v} ct state established,related accept",
                f"iifname {v} meta l4proto {{ icmp, ipv6-icmp }} accept",
                # connections our per-sandbox rules redirected to the node's egress proxy
                f"iifname {v} meta l4proto tcp ct status dnat accept",
                f"iifname {v} drop",
            ]),
            "forward": ("type filter hook forward priority -10; policy accept;", [
                f"oifname {v} ct state established,related accept",
                f"oifname {v} drop",
                "iifname @no_internet drop",
                f"iifname {v} ip6 daddr @blocked6 drop",
                f"iifname {v} meta nfproto ipv6 drop",
                f"iifname {v} ip daddr @dns meta l4proto {{ tcp, udp }} th dport 53 accept",
                f"iifname {v} ip daddr @blocked drop",
                f"iifname {v} iifname vmap @egress_fwd",
            ]),
            "egress_pre": ("type nat hook prerouting priority dstnat; policy accept;", [
                f"iifname {v} iifname vmap @egress_nat",
            ]),
            "postrouting": ("type nat hook postrouting priority srcnat; policy accept;", [
                f"ip saddr {self.pool} oifname != {v} masquerade",
            ]),
        }
        for name, (spec, rules) in chains.items():
            lines += [f"add chain {t} {name} {{ {spec} }}", f"flush chain {t} {name}"]
            lines += [f"add rule {t} {name} {rule}" for rule in rules]
        return "\n".join(lines) + "\n"

    async def setup(self, dns: Sequence[str], blocked: Iterable[str]) -> None:
        """Create or refresh the table and switch on IPv4 forwarding."""
        await run_command(["nft", "-f", "-"], stdin=self._script(dns, blocked).encode(), timeout=NFT_TIMEOUT)
        try:
            previous = _set_ip_forward("1")
        except OSError as exc:
            raise RuntimeFailure(f"cannot enable IPv4 forwarding: {exc}") from exc
        if previous != "1" and self._saved_ip_forward is None:
            self._saved_ip_forward = previous

    async def teardown(self) -> None:
        """Delete our table and put ``ip_forward`` back if :meth:`setup` changed it. Idempotent."""
        listing = await run_command(["nft", "list", "tables"], timeout=NFT_TIMEOUT)
        if f"table inet {self.table}\n" in listing.stdout_text + "\n":
            await run_command(["nft", "delete", "table", "inet", self.table], timeout=NFT_TIMEOUT)
        if self._saved_ip_forward is not None:
            _set_ip_forward(self._saved_ip_forward)
            self._saved_ip_forward = None

    async def block_internet(self, ifname: str) -> None:
        """Drop everything ``ifname`` sends beyond the host (the agent stays reachable)."""
        await run_command(["nft", "add", "element", "inet", self.table, "no_internet", f"{{ \"{ifname}\" }}"],
                          timeout=NFT_TIMEOUT)

    async def unblock_internet(self, ifname: str) -> None:
        """Undo :meth:`block_internet`; a missing element is fine."""
        result = await run_command(
            ["nft", "delete", "element", "inet", self.table, "no_internet", f"{{ \"{ifname}\" }}"],
            timeout=NFT_TIMEOUT, check=False,
        )
        if result.returncode != 0 and "No such file or directory" not in result.stderr_text:
            raise RuntimeFailure(f"cannot remove {ifname} from no_internet: {result.stderr_text.strip()}")

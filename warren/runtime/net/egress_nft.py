"""Per-sandbox egress rules in warren's nft table, keyed by the sandbox's host veth ``X``.

Objects (all in ``table inet <table>``, replaced atomically in one ``nft -f`` transaction):

    set   ea-X   allowed IPv4 ranges (``allowOut`` IPs/CIDRs, plus the DNS servers when it names domains)
    set   ed-X   denied IPv4 ranges (``denyOut``)
    chain ef-X   forward: ``@ea-X`` accept, ``@ed-X`` reject (allow beats deny); jumped from the
                 ``egress_fwd`` verdict map after the table's own drops (always-denied ranges, the host)
    chain en-X   nat prerouting: what goes to the node's egress proxy on port P (all TCP with an upstream
                 SOCKS5 proxy; TCP 80/443 when there are header rules; any TCP port to a denied address
                 when ``allowOut`` names a domain);
                 jumped from ``egress_nat``

Destinations in the table's ``blocked`` set and DNS to the node's resolvers are never redirected.
"""

from __future__ import annotations

from warren.errors import RuntimeFailure
from warren.runtime.net.egress_policy import CompiledEgress
from warren.runtime.oci.command import run_command

__all__ = ["EgressRules"]

NFT_TIMEOUT = 15.0


class EgressRules:
    def __init__(self, table: str) -> None:
        self.t = f"inet {table}"

    def script(self, ifname: str, egress: CompiledEgress, proxy_port: int) -> str:
        t = self.t
        ea, ed, ef, en = f"ea-{ifname}", f"ed-{ifname}", f"ef-{ifname}", f"en-{ifname}"
        lines = [
            f"add set {t} {ea} {{ type ipv4_addr; flags interval; auto-merge; }}",
            f"add set {t} {ed} {{ type ipv4_addr; flags interval; auto-merge; }}",
            f"add chain {t} {ef}",
            f"add chain {t} {en}",
            f"flush chain {t} {ef}",
            f"flush chain {t} {en}",
            f"flush set {t} {ea}",
            f"flush set {t} {ed}",
        ]
        if egress.ip_allow:
            lines.append(f"add element {t} {ea} {{ {', '.join(str(n) for n in egress.ip_allow)} }}")
        if egress.ip_deny:
            lines.append(f"add element {t} {ed} {{ {', '.join(str(n) for n in egress.ip_deny)} }}")
        lines += [
            f"add rule {t} {ef} ip daddr @{ea} accept",
            f"add rule {t} {ef} ip daddr @{ed} meta l4proto tcp reject with tcp reset",
            f"add rule {t} {ef} ip daddr @{ed} reject with icmp type admin-prohibited",
            f"add rule {t} {en} ip daddr @blocked return",
            f"add rule {t} {en} ip daddr @dns th dport 53 return",
        ]
        if egress.policy.upstream is not None:  # every TCP connection is tunneled (after the proxy's checks)
            lines.append(f"add rule {t} {en} meta l4proto tcp redirect to :{proxy_port}")
        if egress.policy.rules:
            lines.append(f"add rule {t} {en} tcp dport {{ 80, 443 }} redirect to :{proxy_port}")
        if egress.domains and egress.ip_deny:
            lines += [
                f"add rule {t} {en} ip daddr @{ea} return",
                f"add rule {t} {en} ip daddr @{ed} meta l4proto tcp redirect to :{proxy_port}",
            ]
        lines += [
            f'add element {t} egress_fwd {{ "{ifname}" : jump {ef} }}',
            f'add element {t} egress_nat {{ "{ifname}" : jump {en} }}',
        ]
        return "\n".join(lines) + "\n"

    async def apply(self, ifname: str, egress: CompiledEgress, proxy_port: int) -> None:
        """Install or replace the rules of ``ifname`` (removes them when the policy enforces nothing)."""
        if not egress.enforced:
            await self.remove(ifname)
            return
        await run_command(["nft", "-f", "-"], stdin=self.script(ifname, egress, proxy_port).encode(),
                          timeout=NFT_TIMEOUT)

    async def remove(self, ifname: str) -> None:
        """Delete the rules of ``ifname``; missing pieces are fine."""
        t = self.t
        steps = [
            f'delete element {t} egress_fwd {{ "{ifname}" }}',
            f'delete element {t} egress_nat {{ "{ifname}" }}',
            f"delete chain {t} ef-{ifname}",
            f"delete chain {t} en-{ifname}",
            f"delete set {t} ea-{ifname}",
            f"delete set {t} ed-{ifname}",
        ]
        result = await run_command(["nft", "-f", "-"], stdin=("\n".join(steps) + "\n").encode(),
                                   timeout=NFT_TIMEOUT, check=False)
        if result.returncode == 0:
            return
        errors = []
        for step in steps:  # some pieces were missing: remove the others one by one
            one = await run_command(["nft", *step.split()], timeout=NFT_TIMEOUT, check=False)
            if one.returncode != 0 and "No such file or directory" not in one.stderr_text:
                errors.append(one.stderr_text.strip())
        if errors:
            raise RuntimeFailure(f"cannot remove the egress rules of {ifname}: {'; '.join(errors)}")

"""A sandbox's :class:`EgressPolicy` compiled for the two places that enforce it.

* nftables (``egress_nft``) gets the IP and CIDR entries (``ip_allow``, ``ip_deny``) and whether
  connections must go through the proxy (``domains``: a denied address may still be reached by name;
  ``rules``: HTTP(S) requests get headers);
* the egress proxy asks :meth:`CompiledEgress.allows` (address + the name the client announced) and
  :meth:`CompiledEgress.headers_for`.

Names: an exact entry matches that name only; ``*.suffix`` matches any name below ``suffix`` (any depth),
not ``suffix`` itself. For header rules an exact entry wins, then the longest matching wildcard.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from warren.store import EgressPolicy

__all__ = ["DEFAULT_DNS", "CompiledEgress", "compile_egress"]

DEFAULT_DNS = ("8.8.8.8",)
"""E2B's default ``dnsServers``, opened when ``allowOut`` names a domain."""


def _is_cidr(entry: str) -> bool:
    return entry[:1].isdigit() and "/" in entry


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("*."):
        return name.endswith(pattern[1:])
    return name == pattern


@dataclass(frozen=True)
class CompiledEgress:
    policy: EgressPolicy
    ip_allow: tuple[ipaddress.IPv4Network, ...]
    ip_deny: tuple[ipaddress.IPv4Network, ...]
    domains: tuple[str, ...]

    @property
    def enforced(self) -> bool:
        """Whether the sandbox needs per-sandbox rules at all."""
        return not self.policy.is_open

    @property
    def proxied(self) -> bool:
        """Whether some connections go through the egress proxy."""
        tunneled = self.policy.upstream is not None
        return bool(self.policy.rules) or tunneled or (bool(self.domains) and bool(self.ip_deny))

    def name_allowed(self, name: str) -> bool:
        return any(_matches(name, d) for d in self.domains)

    def allows(self, address: str, name: str | None) -> bool:
        """Allowed address, else allowed name, else not denied (allow beats deny)."""
        ip = ipaddress.IPv4Address(address)
        if any(ip in net for net in self.ip_allow):
            return True
        if name is not None and self.name_allowed(name):
            return True
        return not any(ip in net for net in self.ip_deny)

    def only_by_name(self, address: str, name: str | None) -> bool:
        """Whether ``address`` is allowed only because of ``name`` (denied, not allowed, name allowed):
        the proxy then dials the name's own addresses, not ``address``."""
        ip = ipaddress.IPv4Address(address)
        if any(ip in net for net in self.ip_allow) or not any(ip in net for net in self.ip_deny):
            return False
        return name is not None and self.name_allowed(name)

    def headers_for(self, name: str | None) -> tuple[tuple[str, str], ...] | None:
        """The headers to set on requests to ``name``; None when no rule matches."""
        if name is None:
            return None
        best: tuple[int, tuple[tuple[str, str], ...]] | None = None
        for rule in self.policy.rules:
            if rule.host == name:
                return rule.headers
            if rule.host.startswith("*.") and _matches(name, rule.host) and (best is None or len(rule.host) > best[0]):
                best = (len(rule.host), rule.headers)
        return best[1] if best is not None else None


def compile_egress(policy: EgressPolicy) -> CompiledEgress:
    allow = [ipaddress.IPv4Network(e) for e in policy.allow_out if _is_cidr(e)]
    domains = tuple(e for e in policy.allow_out if not _is_cidr(e))
    if domains:
        dns = DEFAULT_DNS if policy.dns_servers is None else policy.dns_servers
        allow += [ipaddress.IPv4Network(f"{d}/32") for d in dns]
    deny = tuple(ipaddress.IPv4Network(e) for e in policy.deny_out)
    return CompiledEgress(policy, tuple(allow), deny, domains)

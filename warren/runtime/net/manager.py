"""The sandbox network manager: address pool + netns/veth + nftables, behind one object.

Usage::

    network = NetworkManager(NetConfig())
    await network.setup()                      # nft table, ip_forward; idempotent
    net = await network.create("sbx1", allow_internet=True)
    ...                                        # hand net.netns_path to the OCI runtime
    await network.destroy(net)                 # idempotent
    await network.teardown()                   # tests: delete the table again
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from warren.errors import RuntimeFailure
from warren.runtime.net.egress_ca import EgressCA
from warren.runtime.net.egress_nft import EgressRules
from warren.runtime.net.egress_policy import CompiledEgress, compile_egress
from warren.runtime.net.egress_proxy import EgressProxy, ProxyThread
from warren.runtime.net.nat import DEFAULT_BLOCKED, NatRules, host_subnets
from warren.runtime.net.netns import (
    IFNAMSIZ,
    create_netns,
    delete_netns,
    link_exists,
    list_netns,
    netns_path,
)
from warren.runtime.net.pool import AddressPool
from warren.store import EgressPolicy
from warren.store.codec import egress_json, egress_of

__all__ = ["NetConfig", "NetworkManager", "SandboxNetwork", "host_nameservers"]

_log = logging.getLogger(__name__)

FALLBACK_DNS = ("1.1.1.1", "8.8.8.8")
"""Resolvers for sandboxes when the host's own is loopback-only (systemd-resolved, dnsmasq)."""


@dataclass(frozen=True)
class NetConfig:
    """How sandbox networking is laid out on this host."""

    cidr: str = "10.77.0.0/16"
    netns_prefix: str = "wrn-"
    veth_prefix: str = "wv"
    table: str = "warren"
    dns_servers: tuple[str, ...] | None = None
    """None: the host's non-loopback IPv4 resolvers, else :data:`FALLBACK_DNS`."""
    blocked_cidrs: tuple[str, ...] = DEFAULT_BLOCKED
    """Never reachable from a sandbox; the host's own subnets are added at :meth:`NetworkManager.setup`."""
    resolv_conf: Path = field(default=Path("/etc/resolv.conf"))
    egress_dir: Path | None = None
    """Where the egress CA is kept (None: a CA that lives only as long as this manager)."""
    upstream_ca_file: str | None = None
    """Extra CAs the egress proxy trusts for upstreams of HTTPS hosts with header rules."""


@dataclass(frozen=True)
class SandboxNetwork:
    """The network side of one sandbox; serialisable so ``stop`` works after a restart."""

    sandbox_id: str
    netns: str
    host_if: str
    host_ip: str
    guest_ip: str
    prefixlen: int
    slot: int
    allow_internet: bool
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    """The egress policy its nft rules and the egress proxy enforce."""

    @property
    def netns_path(self) -> Path:
        return netns_path(self.netns)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "egress": egress_json(self.egress)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SandboxNetwork:
        values = {k: data[k] for k in cls.__dataclass_fields__ if k != "egress"}
        raw = data.get("egress")
        return cls(**values, egress=egress_of(raw) if isinstance(raw, dict) else EgressPolicy())


def host_nameservers(resolv_conf: Path) -> list[str]:
    """IPv4 ``nameserver`` entries of ``resolv_conf`` that a sandbox can use (not loopback)."""
    servers = []
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                addr = ipaddress.ip_address(parts[1])
            except ValueError:
                continue
            if addr.version == 4 and not addr.is_loopback and not addr.is_unspecified:
                servers.append(str(addr))
    return servers


_SLOT_RACE_RETRIES = 8


class _SlotTaken(Exception):
    """Another process added the veth of the slot we picked after we looked (see ``create``)."""


class NetworkManager:
    """Creates and destroys per-sandbox network namespaces; owns the nft table and the pool."""

    def __init__(self, config: NetConfig | None = None) -> None:
        self.config = config or NetConfig()
        self.pool = AddressPool(self.config.cidr)
        widest = f"{self.config.veth_prefix}{self.pool.size - 1}"
        if len(widest) > IFNAMSIZ:
            raise ValueError(f"veth names like {widest!r} exceed {IFNAMSIZ} characters")
        self.nat = NatRules(self.config.table, self.pool.network, self.config.veth_prefix)
        self.dns_servers: tuple[str, ...] = self.config.dns_servers or (
            tuple(host_nameservers(self.config.resolv_conf)) or FALLBACK_DNS
        )
        self.egress_rules = EgressRules(self.config.table)
        self._egress: dict[str, CompiledEgress] = {}
        """Guest address -> the policy of the sandbox there (what the egress proxy asks, from its thread:
        single get/set operations on a dict, atomic under the GIL)."""
        self.proxy: EgressProxy | None = None
        self._proxy_thread: ProxyThread | None = None

    def netns_name(self, sandbox_id: str) -> str:
        return f"{self.config.netns_prefix}{sandbox_id}"

    def _ifname(self, slot: int) -> str:
        return f"{self.config.veth_prefix}{slot}"

    async def setup(self) -> None:
        """Install the nft table (idempotent) and enable IPv4 forwarding."""
        blocked = [*self.config.blocked_cidrs, *await host_subnets(self.pool.network)]
        await self.nat.setup(self.dns_servers, blocked)
        if self.proxy is None:
            ca = await asyncio.to_thread(EgressCA, self.config.egress_dir)
            proxy = EgressProxy(self._egress.get, [*blocked, self.config.cidr], ca, self.config.upstream_ca_file,
                                self.dns_servers)
            thread = ProxyThread(proxy)
            await thread.start()
            self.proxy, self._proxy_thread = proxy, thread

    async def teardown(self) -> None:
        """Remove the nft table and restore ``ip_forward``. Sandboxes still running lose egress."""
        await self.close()
        await self.nat.teardown()

    async def close(self) -> None:
        """Stop the egress proxy (the node is stopping; sandboxes keep their nft rules)."""
        if self._proxy_thread is not None:
            await self._proxy_thread.close()
        self.proxy = self._proxy_thread = None

    @property
    def ca_pem(self) -> bytes:
        """The egress CA certificate sandboxes with header rules must trust."""
        if self.proxy is None:
            raise RuntimeFailure("the egress proxy is not running (NetworkManager.setup was not called)")
        return self.proxy.ca.pem

    async def set_egress(self, net: SandboxNetwork, egress: EgressPolicy) -> SandboxNetwork:
        """Enforce ``egress`` for ``net`` now (replacing what it had); return the network that records it."""
        compiled = compile_egress(egress)
        if compiled.enforced:
            if self.proxy is None:
                raise RuntimeFailure("egress policies need the egress proxy (NetworkManager.setup was not called)")
            self._egress[net.guest_ip] = compiled
            await self.egress_rules.apply(net.host_if, compiled, self.proxy.port)
        else:
            await self.egress_rules.remove(net.host_if)
            self._egress.pop(net.guest_ip, None)
        return dataclasses.replace(net, egress=egress)

    async def create(self, sandbox_id: str, *, allow_internet: bool = True,
                     egress: EgressPolicy | None = None) -> SandboxNetwork:
        """A fresh namespace + veth for ``sandbox_id``. Undoes its own partial work on failure.

        A slot whose veth another process (a second node on the host) added between our look and our
        ``link add`` is left to that process, and the next free slot is tried."""
        for _ in range(_SLOT_RACE_RETRIES):
            try:
                return await self._create_in_slot(sandbox_id, allow_internet, egress or EgressPolicy())
            except _SlotTaken:
                continue
        return await self._create_in_slot(sandbox_id, allow_internet, egress or EgressPolicy(), last_try=True)

    async def _create_in_slot(self, sandbox_id: str, allow_internet: bool, egress: EgressPolicy, *,
                              last_try: bool = False) -> SandboxNetwork:
        slot = self.pool.allocate(busy=lambda i: link_exists(self._ifname(i)))
        net = SandboxNetwork(
            sandbox_id=sandbox_id,
            netns=self.netns_name(sandbox_id),
            host_if=self._ifname(slot.index),
            host_ip=slot.host_ip,
            guest_ip=slot.guest_ip,
            prefixlen=slot.prefixlen,
            slot=slot.index,
            allow_internet=allow_internet,
        )
        try:
            if not allow_internet:
                await self.nat.block_internet(net.host_if)  # before the link exists: no window
            if not egress.is_open:
                net = await self.set_egress(net, egress)  # also before the link exists
            await create_netns(net.netns, net.host_if, net.host_ip, net.guest_ip, net.prefixlen)
        except RuntimeFailure as exc:
            if last_try or "File exists" not in str(exc) or not link_exists(net.host_if):
                await self._undo(net, sandbox_id)
                raise
            # Not ours: remove only our namespace and nft element, never the other process's veth.
            await self._undo(net, sandbox_id, keep_veth=True)
            raise _SlotTaken from exc
        except BaseException:
            await self._undo(net, sandbox_id)
            raise
        return net

    async def _undo(self, net: SandboxNetwork, sandbox_id: str, *, keep_veth: bool = False) -> None:
        try:
            await self.destroy(net, keep_veth=keep_veth)
        except Exception:
            _log.exception("cleanup of half-made network for %s failed", sandbox_id)

    async def destroy(self, net: SandboxNetwork, *, keep_veth: bool = False) -> None:
        """Remove the veth, the namespace and the nft element; free the slot. Idempotent."""
        await delete_netns(net.netns, None if keep_veth else net.host_if)
        if not net.egress.is_open or net.guest_ip in self._egress:
            self._egress.pop(net.guest_ip, None)
            await self.egress_rules.remove(net.host_if)
        if not net.allow_internet:
            await self.nat.unblock_internet(net.host_if)
        self.pool.release(net.slot)

    def adopt(self, net: SandboxNetwork) -> None:
        """Re-register a sandbox network that outlived a restart, so its slot is not handed out."""
        self.pool.reserve(net.slot)

    async def adopt_egress(self, net: SandboxNetwork) -> None:
        """Enforce the egress policy of an adopted network again (the proxy has a new port)."""
        if not net.egress.is_open:
            await self.set_egress(net, net.egress)

    async def reap(self, keep: Collection[str]) -> list[str]:
        """Delete our namespaces whose sandbox id is not in ``keep``; return the names removed.

        For recovery after a crash. The host end of each veth dies with its peer in the namespace.
        """
        removed = []
        for name in list_netns(self.config.netns_prefix):
            if name[len(self.config.netns_prefix):] in keep:
                continue
            try:
                await delete_netns(name, None)
                removed.append(name)
            except RuntimeFailure:
                _log.exception("could not reap network namespace %s", name)
        return removed

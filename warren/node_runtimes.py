"""Build and start the node's runtimes: one network manager shared by runc and runsc backends."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from .config import Settings
from .runtime import NetConfig, NetworkManager, OciRuntime
from .runtime.assets import AssetCache
from .runtime.base import Runtime, RuntimeKind
from .runtime.disk import SandboxDisks
from .runtime.index import RuntimeIndex
from .runtime.reaper import ReapReport, reap_orphans
from .runtime.records import RuntimeConfig
from .runtime.registry import RuntimeRegistry, load_configs, local_configs
from .runtime.userns import RangeAllocator

log = logging.getLogger(__name__)

ASSET_MAX_BYTES = 2 << 30
"""Largest single runtime asset the node fetches (a runsc binary is ~40 MB, a kernel less)."""


def guest_source_dir() -> Path:
    """The ``warren/guest`` package, copied into the agent bundle."""
    return Path(__file__).resolve().parent / "guest"


def _binary(name: str, override: Path | None) -> Path:
    if override is not None:
        return override
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    return Path(found) if found else Path(f"/usr/bin/{name}")


@dataclass
class NodeRuntimes:
    network: NetworkManager
    backends: dict[RuntimeKind, OciRuntime]
    registry: RuntimeRegistry

    def configs(self, settings: Settings) -> list[RuntimeConfig]:
        """What the node runs: the runtimes file if set, else its local binaries."""
        if settings.runtimes_file is not None:
            return load_configs(settings.runtimes_file)
        gvisor = self.backends[RuntimeKind.GVISOR]
        return local_configs(self.backends[RuntimeKind.RUNC].binary, gvisor.binary if gvisor.binary.is_file() else None)

    async def reload(self, settings: Settings) -> None:
        """Re-read the configs: register durably first, then switch defaults and prewarm."""
        configs = await asyncio.to_thread(self.configs, settings)
        await self.registry.configure(configs)

    def as_mapping(self) -> dict[RuntimeKind, Runtime]:
        return dict(self.backends)

    async def aclose(self) -> None:
        """Wait for the backends' background work (releases of checkpointed sandboxes): at shutdown,
        after the last pause."""
        for backend in self.backends.values():
            await backend.aclose()
        await self.network.close()


async def start_runtimes(settings: Settings, agent_bundle: Path) -> NodeRuntimes:
    """Set up networking (nftables table, ip_forward) and probe every backend; reload their records."""
    network = NetworkManager(NetConfig(
        cidr=settings.network_cidr, dns_servers=settings.dns_servers or None, table=settings.network_table,
        netns_prefix=f"wr{settings.network_prefix}-" if settings.network_prefix else "wrn-",
        veth_prefix=f"w{settings.network_prefix}" if settings.network_prefix else "wv",
        egress_dir=settings.state_dir / "egress",
        upstream_ca_file=str(settings.egress_upstream_ca) if settings.egress_upstream_ca else None,
    ))
    await network.setup()
    cgroup_parent = settings.node_name
    disks = SandboxDisks(settings.state_dir, enabled=settings.disk_quota, size_mb=settings.sandbox_disk_mb)
    backends = {
        RuntimeKind.RUNC: OciRuntime(
            RuntimeKind.RUNC, _binary("runc", None), settings.state_dir, agent_bundle, network,
            cgroup_parent=cgroup_parent, hardened=settings.hardening,
            uid_ranges=RangeAllocator() if settings.hardening else None, disks=disks,
        ),
        RuntimeKind.GVISOR: OciRuntime(
            RuntimeKind.GVISOR, _binary("runsc", settings.runsc_path), settings.state_dir, agent_bundle, network,
            cgroup_parent=cgroup_parent, hardened=settings.hardening, disks=disks,
        ),
    }  # fmt: skip
    for kind, backend in backends.items():
        probe = await backend.setup()
        log.info("runtime %s: %s", kind.value, probe)
        await backend.recover()
    index = RuntimeIndex(settings.state_dir / "runtime-index.json")
    await asyncio.to_thread(index.load)
    cache = await asyncio.to_thread(AssetCache, settings.state_dir / "assets", max_bytes=ASSET_MAX_BYTES)
    runtimes = NodeRuntimes(network, backends, RuntimeRegistry(index, cache))
    await runtimes.reload(settings)
    return runtimes


async def reap_orphans_for_node(
    node_runtimes: NodeRuntimes, known_ids: Collection[str], settings: Settings
) -> ReapReport:
    """Stop and remove the sandboxes this node's markers name but its store does not know (a crash
    between starting a sandbox and recording it, or records lost); see :mod:`warren.runtime.reaper`.

    Call once at start-up, after ``SandboxManager.recover()`` and before anything starts sandboxes
    (serving, template builds). Never raises: orphans left by a failure are retried at the next start.
    """
    backends = list(node_runtimes.backends.values())
    parents = {b.cgroup_parent for b in backends} or {settings.node_name}
    if len(parents) != 1:
        log.error("backends use different cgroup parents %s; not reaping orphans", sorted(parents))
        return ReapReport()
    try:
        report = await reap_orphans(known=known_ids, backends=backends, network=node_runtimes.network,
                                    state_dir=settings.state_dir, cgroup_parent=parents.pop())
    except Exception:
        log.exception("reaping orphaned sandboxes failed; the next start tries again")
        return ReapReport()
    if report.orphans:
        log.warning("reaped %d orphaned sandboxes: %s; failed: %s", len(report.orphans), ", ".join(report.orphans),
                    dict(report.failed) or "none")
    return report

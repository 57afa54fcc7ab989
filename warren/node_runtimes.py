"""Build and start the node's runtimes: one network manager shared by runc and runsc backends."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from .config import Settings
from .runtime import NetConfig, NetworkManager, OciRuntime
from .runtime.base import Runtime, RuntimeKind

log = logging.getLogger(__name__)


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

    def as_mapping(self) -> dict[RuntimeKind, Runtime]:
        return dict(self.backends)


async def start_runtimes(settings: Settings, agent_bundle: Path) -> NodeRuntimes:
    """Set up networking (nftables table, ip_forward) and probe every backend; reload their records."""
    network = NetworkManager(NetConfig(cidr=settings.network_cidr))
    await network.setup()
    cgroup_parent = settings.node_name
    backends = {
        RuntimeKind.RUNC: OciRuntime(
            RuntimeKind.RUNC, _binary("runc", None), settings.state_dir, agent_bundle, network,
            cgroup_parent=cgroup_parent,
        ),
        RuntimeKind.GVISOR: OciRuntime(
            RuntimeKind.GVISOR, _binary("runsc", settings.runsc_path), settings.state_dir, agent_bundle, network,
            cgroup_parent=cgroup_parent,
        ),
    }  # fmt: skip
    for kind, backend in backends.items():
        probe = await backend.setup()
        log.info("runtime %s: %s", kind.value, probe)
        await backend.recover()
    return NodeRuntimes(network, backends)

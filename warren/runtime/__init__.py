"""Isolation backends: everything that runs runc, runsc, ip, nft or mount lives below this package.

A node needs :func:`build_agent_bundle`, one :class:`NetworkManager` (``await setup()``) and an
:class:`OciRuntime` per kind sharing it (``await setup()`` probes; ``await recover()`` re-adopts).
"""

from warren.runtime.agent_bundle import AGENT_ARGV, agent_environment, build_agent_bundle
from warren.runtime.base import (
    AGENT_MOUNT,
    AGENT_PORT,
    PauseMode,
    Resources,
    Runtime,
    RuntimeKind,
    SandboxHandle,
    SandboxSpec,
    SandboxStats,
)
from warren.runtime.cgroups import CgroupHierarchies, CgroupUsage
from warren.runtime.net import NetConfig, NetworkManager, SandboxNetwork
from warren.runtime.oci.command import CommandResult, RuntimeCommandError, run_command
from warren.runtime.oci.layout import SandboxPaths
from warren.runtime.oci.runtime import OciRuntime
from warren.runtime.probe import probe_runc, probe_runsc

__all__ = [
    "AGENT_ARGV",
    "AGENT_MOUNT",
    "AGENT_PORT",
    "CgroupHierarchies",
    "CgroupUsage",
    "CommandResult",
    "NetConfig",
    "NetworkManager",
    "OciRuntime",
    "PauseMode",
    "Resources",
    "Runtime",
    "RuntimeCommandError",
    "RuntimeKind",
    "SandboxHandle",
    "SandboxNetwork",
    "SandboxPaths",
    "SandboxSpec",
    "SandboxStats",
    "agent_environment",
    "build_agent_bundle",
    "probe_runc",
    "probe_runsc",
    "run_command",
]

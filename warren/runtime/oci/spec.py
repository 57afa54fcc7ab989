"""The OCI runtime spec (``config.json``) warren hands to runc and runsc.

One pure function, :func:`build_config`; everything host-specific arrives as an argument.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warren.runtime.base import AGENT_MOUNT, Resources
from warren.runtime.oci.seccomp import seccomp_profile
from warren.runtime.userns import UidRange

__all__ = [
    "AGENT_OOM_SCORE_ADJ", "BOOT_ID", "CPU_PERIOD_US", "DEFAULT_CAPABILITIES", "HARDENED_CAPABILITIES",
    "SANDBOX_OOM_SCORE_ADJ", "ConfigInputs", "build_config",
]

OCI_VERSION = "1.0.2"

CPU_PERIOD_US = 100_000
"""CFS period; the quota is ``cpu_count`` periods, so ``cpu_count`` cores' worth of time."""

AGENT_OOM_SCORE_ADJ = -998
"""The agent's OOM score: a memory bomb in the sandbox is killed before the agent (-1000 = never)."""

DEFAULT_CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
    "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SYS_CHROOT", "CAP_MKNOD", "CAP_AUDIT_WRITE",
    "CAP_SETFCAP",
)
"""Docker's default set: what an unhardened sandbox (``hardened=False``, benchmarks only) gets."""

HARDENED_CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
    "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_AUDIT_WRITE",
)
"""What the agent, ``su`` and ``sudo`` need to switch users and own files, all held in the sandbox's own
user namespace (nothing on the host): no MKNOD, NET_RAW, SETFCAP, SYS_ADMIN, SYS_MODULE, ..."""

SANDBOX_OOM_SCORE_ADJ = 500
"""A hardened sandbox's processes, agent included, are the host OOM killer's first choice; set by runc
with privilege, so nothing inside can go below it (lowering needs CAP_SYS_RESOURCE on the host)."""

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_MASKED_PATHS = (
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
)
_HARDENED_MASKED_PATHS = (
    "/proc/interrupts", "/proc/kmsg", "/sys/devices/virtual/powercap", "/sys/fs/cgroup", "/sys/fs/bpf",
    "/sys/fs/fuse", "/sys/fs/pstore", "/sys/kernel/debug", "/sys/kernel/tracing", "/sys/kernel/security",
    "/sys/kernel/config", "/sys/module",
)
"""Host data a sandbox has no use for: energy counters (power side channels), other cgroups (every
sandbox id), tracing, kernel logs, module parameters."""
_READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
MIB = 1024 * 1024
BOOT_ID = "/proc/sys/kernel/random/boot_id"

_SYS_MOUNT = {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}
_SYS_BIND = {"destination": "/sys", "type": "bind", "source": "/sys",
             "options": ["rbind", "nosuid", "noexec", "nodev", "ro"]}
"""In a user namespace that does not own the netns, sysfs cannot be mounted: the host's is bound read-only
(recursively: its submounts are locked to it), with the host's parts masked (_HARDENED_MASKED_PATHS)."""


@dataclass(frozen=True)
class ConfigInputs:
    """Everything :func:`build_config` needs for one sandbox."""

    hostname: str
    rootfs: Path
    """The merged overlay directory (absolute, no symlinks: runc insists)."""
    netns_path: Path
    agent_bundle: Path
    etc_files: Mapping[str, Path]
    """Generated files bind-mounted over the rootfs: ``{"/etc/hosts": host_path, ...}``."""
    cgroups_path: str
    resources: Resources
    args: Sequence[str]
    env: Mapping[str, str]
    nofile: int = 1048576
    """RLIMIT_NOFILE (soft = hard); above the host process's own hard limit it needs CAP_SYS_RESOURCE."""
    oom_score_adj: int | None = AGENT_OOM_SCORE_ADJ
    """None leaves the runtime's own score (0); lowering it needs CAP_SYS_RESOURCE on the host."""
    hardened: bool = True
    """seccomp allowlist, cgroup namespace, fewer capabilities, more masked paths (off: benchmarks only)."""
    uid_range: UidRange | None = None
    """The host range of a user namespace (uid/gid 0..65535 inside); None: no user namespace."""
    tmp_dir: Path | None = None
    """A host directory bind-mounted at ``/tmp``: gVisor gets the rootfs's own ``/tmp`` this way, as runsc
    covers an empty ``/tmp`` with a tmpfs of its own otherwise. None: ``/tmp`` is the rootfs's directory,
    on the sandbox's disk (so builds, snapshots, forks and pauses keep it, as in E2B)."""
    tmp_tmpfs: bool = False
    """A tmpfs at ``/tmp`` instead (mode 1777): only for images that ask for one."""
    boot_id: Path | None = None
    """A host file (the sandbox's boot id) shown read-only at ``/proc/sys/kernel/random/boot_id``."""
    mount_binary: Path | None = None
    """With ``boot_id``: mount(8), run as runc's createContainer hook to bind the file (runc refuses spec
    mounts under /proc but for a few lxcfs files). None: a spec mount does it (runsc)."""


def _mounts(inp: ConfigInputs) -> list[dict[str, Any]]:
    shm_size = f"size={max(64, inp.resources.memory_mb // 2)}m"
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "nodev", "mode=1777", shm_size]},
        _SYS_BIND if inp.uid_range is not None else _SYS_MOUNT,
        {"destination": AGENT_MOUNT, "type": "bind", "source": str(inp.agent_bundle),
         "options": ["rbind", "ro", "nosuid", "nodev"]},
    ]
    if inp.tmp_tmpfs:
        mounts.append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                       "options": ["nosuid", "nodev", "mode=1777"]})
    elif inp.tmp_dir is not None:
        mounts.append({"destination": "/tmp", "type": "bind", "source": str(inp.tmp_dir),
                       "options": ["rbind", "rw", "nosuid", "nodev"]})
    for dest, src in sorted(inp.etc_files.items()):
        mounts.append({"destination": dest, "type": "bind", "source": str(src), "options": ["bind", "rw"]})
    if inp.boot_id is not None and inp.mount_binary is None:
        mounts.append({"destination": BOOT_ID, "type": "bind", "source": str(inp.boot_id),
                       "options": ["bind", "ro", "nosuid", "nodev", "noexec"]})
    return mounts


def _hooks(inp: ConfigInputs) -> dict[str, Any]:
    """runc: bind the boot id file over procfs's from inside the container's mount namespace, after its
    mounts and before pivot_root (so host paths still resolve), with the rights of the container's root."""
    if inp.boot_id is None or inp.mount_binary is None:
        return {}
    target = f"{inp.rootfs}{BOOT_ID}"
    bind = {"path": str(inp.mount_binary),
            "args": ["mount", "-n", "--bind", "-o", "ro,nosuid,nodev,noexec", str(inp.boot_id), target]}
    return {"createContainer": [bind]}


def _resources(res: Resources) -> dict[str, Any]:
    memory = res.memory_mb * MIB
    return {
        "devices": [{"allow": False, "access": "rwm"}],
        # swap == limit: in cgroup v1 this is memory.memsw.limit_in_bytes, so swap is no escape hatch.
        "memory": {"limit": memory, "swap": memory},
        "cpu": {"quota": res.cpu_count * CPU_PERIOD_US, "period": CPU_PERIOD_US},
        "pids": {"limit": res.pids_max},
    }


def build_config(inp: ConfigInputs) -> dict[str, Any]:
    """The ``config.json`` document for one sandbox running the agent as root."""
    caps = list(HARDENED_CAPABILITIES if inp.hardened else DEFAULT_CAPABILITIES)
    env = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", **inp.env}
    config: dict[str, Any] = {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": list(inp.args),
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": "/",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": inp.nofile, "soft": inp.nofile}],
            # False: sudo and other setuid tools inside the sandbox must keep working; in a user namespace
            # their root is the sandbox's unprivileged range, not host root.
            "noNewPrivileges": False,
        },
        "root": {"path": str(inp.rootfs), "readonly": False},
        "hostname": inp.hostname,
        "mounts": _mounts(inp),
        "linux": {
            "namespaces": [
                {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                {"type": "network", "path": str(inp.netns_path)},
            ],
            "cgroupsPath": inp.cgroups_path,
            "resources": _resources(inp.resources),
            "maskedPaths": list(_MASKED_PATHS),
            "readonlyPaths": list(_READONLY_PATHS),
        },
    }
    if inp.oom_score_adj is not None:
        config["process"]["oomScoreAdj"] = inp.oom_score_adj
    if hooks := _hooks(inp):
        config["hooks"] = hooks
    linux = config["linux"]
    if inp.hardened:
        linux["namespaces"].append({"type": "cgroup"})
        linux["maskedPaths"] += list(_HARDENED_MASKED_PATHS)
        linux["seccomp"] = seccomp_profile()
    if inp.uid_range is not None:
        linux["namespaces"].insert(0, {"type": "user"})
        linux["uidMappings"] = inp.uid_range.mapping
        linux["gidMappings"] = inp.uid_range.mapping
    return config

"""Where one OCI runtime keeps its files under ``state_dir``, and the per-sandbox record.

::

    state_dir/
      runtime/<runc|runsc>/         the runtime's private --root (never the system default)
      probe/                        temporary bundles of the runsc startup probe (removed after it)
      sandboxes/<id>/
        sandbox.json                SandboxRecord: what stop()/stats() need, also after a restart
        bundle/config.json          the OCI spec
        bundle/rootfs/              overlay mount point (layers + upper)
        disk.img  disk/             the sandbox's size-capped disk and its mount point (warren.runtime.disk;
                                    a plain dir when sizes are not enforced)
        disk/upper/  disk/work/     overlay upper and work dirs (upper = the sandbox's files)
        lower-empty/                only when the spec has no layers
        etc/{hosts,resolv.conf,hostname}   bind-mounted into the sandbox
        boot_id                     the sandbox's /proc/sys/kernel/random/boot_id (warren.runtime.oci.guestfiles)
        init.pid                    written by the runtime
        runtime.log                 stdout/stderr of the runtime CLI and of the agent
        checkpoint/                 gVisor memory image while paused with PauseMode.MEMORY
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from warren.errors import InvalidRequestError
from warren.runtime.base import PauseMode, Resources, RuntimeKind
from warren.runtime.net.manager import SandboxNetwork
from warren.runtime.userns import UidRange

__all__ = ["SandboxPaths", "SandboxRecord", "validate_sandbox_id", "write_etc_files"]

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,59}$")
"""Ids become a hostname, a netns name, a cgroup and a directory: keep them to safe characters."""

RECORD_VERSION = 1


def validate_sandbox_id(sandbox_id: str) -> None:
    if not _ID_RE.match(sandbox_id):
        raise InvalidRequestError(f"invalid sandbox id {sandbox_id!r}: use 1-60 of [A-Za-z0-9_-]")


@dataclass(frozen=True)
class SandboxPaths:
    root: Path

    @property
    def record(self) -> Path:
        return self.root / "sandbox.json"

    @property
    def bundle(self) -> Path:
        return self.root / "bundle"

    @property
    def rootfs(self) -> Path:
        return self.root / "bundle" / "rootfs"

    @property
    def disk(self) -> Path:
        return self.root / "disk"

    @property
    def upper(self) -> Path:
        return self._disk_root / "upper"

    @property
    def work(self) -> Path:
        return self._disk_root / "work"

    @property
    def _disk_root(self) -> Path:
        """Where upper/ and work/ live: the sandbox's disk, or, for a sandbox made before per-sandbox
        disks (its upper/ directly under its dir), the sandbox dir itself, so it still resumes."""
        return self.root if (self.root / "upper").is_dir() else self.root / "disk"

    @property
    def empty_lower(self) -> Path:
        return self.root / "lower-empty"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def pid_file(self) -> Path:
        return self.root / "init.pid"

    @property
    def log(self) -> Path:
        return self.root / "runtime.log"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def boot_id(self) -> Path:
        return self.root / "boot_id"


@dataclass(frozen=True)
class SandboxRecord:
    """What warren must remember about a started sandbox."""

    sandbox_id: str
    kind: RuntimeKind
    resources: Resources
    network: SandboxNetwork | None
    """None while the sandbox has no network (paused without its processes)."""
    paused: PauseMode | None = None
    binary: str | None = None
    """The runtime CLI this sandbox was made with (its runtime hash's staged binary); None: the backend's."""
    uid_range: UidRange | None = None
    """The host range its user namespace maps 0..65535 to (its upper dir is owned in it); None: none."""

    def to_json(self) -> str:
        return json.dumps({
            "version": RECORD_VERSION,
            "sandbox_id": self.sandbox_id,
            "kind": str(self.kind),
            "resources": asdict(self.resources),
            "network": self.network.to_dict() if self.network else None,
            "paused": str(self.paused) if self.paused else None,
            "binary": self.binary,
            "uid_host": self.uid_range.host if self.uid_range else None,
        })

    @classmethod
    def from_json(cls, text: str) -> SandboxRecord:
        data: dict[str, Any] = json.loads(text)
        if data.get("version") != RECORD_VERSION:
            raise ValueError(f"unknown sandbox record version {data.get('version')!r}")
        return cls(
            sandbox_id=data["sandbox_id"],
            kind=RuntimeKind(data["kind"]),
            resources=Resources(**data["resources"]),
            network=SandboxNetwork.from_dict(data["network"]) if data.get("network") else None,
            paused=PauseMode(data["paused"]) if data.get("paused") else None,
            binary=data.get("binary"),
            uid_range=UidRange(int(data["uid_host"])) if data.get("uid_host") is not None else None,
        )

    def save(self, path: Path) -> None:
        """Atomically: temp file, fsync, rename."""
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w") as fh:
            fh.write(self.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)


def write_etc_files(etc: Path, hostname: str, guest_ip: str, nameservers: tuple[str, ...],
                    owner: UidRange | None = None) -> dict[str, Path]:
    """Write hosts, resolv.conf and hostname for one sandbox; return ``{in-sandbox path: host file}``.

    With ``owner`` they belong to the sandbox's root (its runtime bind-mounts them from inside its
    user namespace, where host root's files are out of reach)."""
    etc.mkdir(mode=0o700, exist_ok=True)
    if owner is not None:
        os.chown(etc, owner.host, owner.host)
    files = {
        "hosts": (
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
            f"{guest_ip}\t{hostname}\n"
        ),
        "resolv.conf": "".join(f"nameserver {ns}\n" for ns in nameservers),
        "hostname": f"{hostname}\n",
    }
    out = {}
    for name, text in files.items():
        (etc / name).write_text(text)
        if owner is not None:
            os.chown(etc / name, owner.host, owner.host)
        out[f"/etc/{name}"] = etc / name
    return out

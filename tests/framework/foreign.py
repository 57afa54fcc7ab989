"""Containers and namespaces that are *not* warren's, to prove the orphan reaper leaves them alone.

``start_foreign_runc`` runs ``sleep`` in a plain runc container under a ``--root`` of the caller's
choosing (what another tool on the host would do with the same runc binary); the caller picks its
cgroup path and, optionally, an existing netns for it. Synchronous, so e2e tests can use it too.

    foreign = start_foreign_runc(runc, tmp / "other", rootfs, "c1", cgroups_path="/elsewhere/c1")
    try:
        ...
        assert foreign.state() == "running"
    finally:
        foreign.delete()
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from warren.runtime.cgroups import CgroupHierarchies

__all__ = ["ForeignContainer", "add_netns", "delete_netns", "start_foreign_runc"]

TIMEOUT = 30


@dataclass
class ForeignContainer:
    runc: Path
    root: Path
    container_id: str
    cgroups_path: str
    bundle: Path

    def _argv(self, *args: str) -> list[str]:
        return [str(self.runc), "--root", str(self.root), *args]

    def state(self) -> str | None:
        res = subprocess.run(self._argv("state", self.container_id), capture_output=True, text=True,
                             timeout=TIMEOUT, check=False)
        return str(json.loads(res.stdout)["status"]) if res.returncode == 0 else None

    def pid(self) -> int:
        res = subprocess.run(self._argv("state", self.container_id), capture_output=True, text=True,
                             timeout=TIMEOUT, check=True)
        return int(json.loads(res.stdout)["pid"])

    def delete(self, *, remove_cgroup_parent: bool = False) -> None:
        """Kill and delete the container; optionally rmdir the (then empty) parent of its cgroup."""
        subprocess.run(self._argv("delete", "--force", self.container_id), capture_output=True,
                       timeout=TIMEOUT, check=False)
        hier = CgroupHierarchies.detect()
        hier.remove(self.cgroups_path)
        if remove_cgroup_parent:
            hier.remove(self.cgroups_path.rstrip("/").rpartition("/")[0])


def start_foreign_runc(runc: Path, workdir: Path, rootfs: Path, container_id: str, *, cgroups_path: str,
                       netns: Path | None = None) -> ForeignContainer:
    """``runc --root <workdir>/root run -d`` a busybox ``sleep`` (read-only rootfs) and return it."""
    root, bundle = workdir / "root", workdir / f"bundle-{container_id}"
    bundle.mkdir(parents=True)
    subprocess.run([str(runc), "spec", "--bundle", str(bundle)], check=True, timeout=TIMEOUT)
    config = json.loads((bundle / "config.json").read_text())
    config["root"] = {"path": str(rootfs), "readonly": True}
    config["process"]["args"] = ["/bin/sleep", "3600"]
    config["process"]["terminal"] = False
    config["linux"]["cgroupsPath"] = cgroups_path
    if netns is not None:
        config["linux"]["namespaces"] = [
            ns for ns in config["linux"]["namespaces"] if ns["type"] != "network"
        ] + [{"type": "network", "path": str(netns)}]
    (bundle / "config.json").write_text(json.dumps(config))
    with (workdir / f"{container_id}.log").open("ab") as log:
        # The detached container inherits stdio: a file, never a pipe (it would never reach EOF).
        subprocess.run([str(runc), "--root", str(root), "run", "-d", "--bundle", str(bundle), container_id],
                       stdin=subprocess.DEVNULL, stdout=log, stderr=log, check=True, timeout=TIMEOUT)
    return ForeignContainer(runc, root, container_id, cgroups_path, bundle)


def add_netns(name: str) -> Path:
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=TIMEOUT)
    return Path("/run/netns") / name


def delete_netns(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=TIMEOUT)

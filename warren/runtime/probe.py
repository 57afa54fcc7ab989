"""Startup probes: can this host run sandboxes with runc / runsc, and with which limits?

The result is a plain dict for ``GET /health``::

    {"available": bool, "reason": str, "kind": "runc"|"gvisor", "binary": str, "version": str, ...}

For runsc the probe starts one tiny networked sandbox, because the Debian runsc 2022 build cannot do
that on kernels >= 6.7 (guest-agent-notes B1, google/gvisor#10704) and ``--version`` cannot tell.
warren never modifies a runtime binary; it reports the problem instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import resource
import secrets
import shutil
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

from warren.runtime.base import AGENT_MOUNT, RuntimeKind
from warren.runtime.net.netns import delete_netns, netns_path
from warren.runtime.oci.command import RuntimeCommandError, run_command
from warren.runtime.oci.spec import AGENT_OOM_SCORE_ADJ
from warren.trees import remove_tree

log = logging.getLogger(__name__)

__all__ = ["B1_MARKER", "agent_process_limits", "has_cap_sys_resource", "is_static_elf", "probe_runc", "probe_runsc"]

B1_MARKER = "cannot run with network enabled in root network namespace"
B1_REASON = (
    "runsc {version} cannot start networked sandboxes on kernel >= 6.7 (gvisor#10704); "
    "install runsc 2024-08 or later"
)
VERSION_TIMEOUT = 10.0
SMOKE_TIMEOUT = 60.0
AGENT_NOFILE = 1048576
_PT_INTERP = 3
_CAP_SYS_RESOURCE = 24


def is_static_elf(path: Path) -> bool:
    """True when ``path`` is a 64-bit little-endian ELF with no program interpreter (statically linked)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return False
            (phoff,) = struct.unpack_from("<Q", head, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
            fh.seek(phoff)
            table = fh.read(phentsize * phnum)
    except OSError:
        return False
    if len(table) < phentsize * phnum:
        return False
    return all(struct.unpack_from("<I", table, i * phentsize)[0] != _PT_INTERP for i in range(phnum))


def has_cap_sys_resource(status: Path = Path("/proc/self/status")) -> bool:
    """Whether this process may lower OOM scores and raise hard rlimits (often missing in nested VMs)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> _CAP_SYS_RESOURCE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def agent_process_limits() -> tuple[int | None, int]:
    """``(oomScoreAdj, RLIMIT_NOFILE)`` for the agent that this process is allowed to ask runc for.

    Without CAP_SYS_RESOURCE (common in nested VMs and some containers) runc can neither lower the
    agent's OOM score nor raise the fd limit above our own hard limit, and would fail every start.
    """
    privileged = has_cap_sys_resource()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = AGENT_NOFILE if privileged or hard == resource.RLIM_INFINITY else min(AGENT_NOFILE, hard)
    return (AGENT_OOM_SCORE_ADJ if privileged else None), nofile


def pin_oom_score(pid: int | None, score: int) -> None:
    """Set a sandbox init's OOM score from here, with CAP_SYS_RESOURCE: that also makes ``score`` the
    floor for it and every process it starts (the kernel's oom_score_adj_min), so nothing inside can
    lower it. runc's own write happens inside the user namespace and sets no floor."""
    if pid is None:
        return
    try:
        Path(f"/proc/{pid}/oom_score_adj").write_text(str(score))
    except OSError as exc:
        log.warning("could not set the OOM score of sandbox init %d: %s", pid, exc)


async def _version(binary: Path) -> str:
    result = await run_command([binary, "--version"], timeout=VERSION_TIMEOUT)
    first = result.stdout_text.splitlines()[0] if result.stdout_text else ""
    return first.rsplit(" ", 1)[-1] if "version" in first else first


async def probe_runc(binary: Path) -> dict[str, Any]:
    """runc: the binary answers ``--version``."""
    info: dict[str, Any] = {"kind": str(RuntimeKind.RUNC), "binary": str(binary)}
    try:
        info["version"] = await _version(binary)
    except RuntimeCommandError as exc:
        return {**info, "available": False, "reason": f"runc is not usable: {exc}"}
    return {**info, "available": True, "reason": ""}


def _make_work_dir(work_dir: Path) -> Path:
    work_dir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="probe-", dir=work_dir))


def _smoke_rootfs(rootfs: Path, agent_bundle: Path | None) -> tuple[list[str], list[dict[str, Any]]]:
    """Fill ``rootfs`` for the smoke sandbox; return its argv and extra mounts."""
    for candidate in (shutil.which("busybox"), "/bin/busybox", "/usr/bin/busybox"):
        if candidate and is_static_elf(Path(candidate)):
            (rootfs / "bin").mkdir(parents=True)
            shutil.copy2(candidate, rootfs / "bin" / "busybox")
            return ["/bin/busybox", "true"], []
    if agent_bundle is None:
        raise FileNotFoundError("no static busybox and no agent bundle to smoke-test with")
    mount = {"destination": AGENT_MOUNT, "type": "bind", "source": str(agent_bundle),
             "options": ["rbind", "ro", "nosuid", "nodev"]}
    return [f"{AGENT_MOUNT}/bin/python3", "-S", "-E", "-c", "pass"], [mount]


def _smoke_config(rootfs: Path, args: list[str], mounts: list[dict[str, Any]], netns: Path) -> dict[str, Any]:
    return {
        "ociVersion": "1.0.2",
        "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": args, "env": ["PATH=/bin"],
                    "cwd": "/"},
        "root": {"path": str(rootfs), "readonly": True},
        "hostname": "probe",
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}, *mounts],
        "linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                                 {"type": "network", "path": str(netns)}]},
    }


async def probe_runsc(
    binary: Path, *, work_dir: Path, platform: str = "ptrace", netns_prefix: str = "wrn-",
    agent_bundle: Path | None = None,
) -> dict[str, Any]:
    """runsc: ``--version``, then one ``--network=sandbox`` sandbox in a fresh netns (detects B1).

    Everything the smoke test makes (temp dir, netns, runsc state) is removed before returning.
    """
    info: dict[str, Any] = {"kind": str(RuntimeKind.GVISOR), "binary": str(binary), "platform": platform}
    try:
        info["version"] = await _version(binary)
    except RuntimeCommandError as exc:
        return {**info, "available": False, "reason": f"runsc is not usable: {exc}"}
    tmp = _make_work_dir(work_dir)
    token = secrets.token_hex(4)
    cid, ns = f"probe-{token}", f"{netns_prefix}probe-{token}"
    flags = [f"--root={tmp / 'state'}", f"--platform={platform}", "--network=sandbox"]
    started = time.monotonic()
    try:
        rootfs, bundle = tmp / "rootfs", tmp / "bundle"
        rootfs.mkdir()
        bundle.mkdir()
        args, mounts = _smoke_rootfs(rootfs, agent_bundle)
        await run_command(["ip", "netns", "add", ns], timeout=VERSION_TIMEOUT)
        config = _smoke_config(rootfs, args, mounts, netns_path(ns))
        (bundle / "config.json").write_text(json.dumps(config))
        result = await run_command([binary, *flags, "run", "--bundle", bundle, cid], timeout=SMOKE_TIMEOUT,
                                   check=False)
    except (RuntimeCommandError, OSError) as exc:
        return {**info, "available": False, "reason": f"runsc smoke test could not run: {exc}"}
    finally:
        await run_command([binary, *flags, "delete", "--force", cid], timeout=SMOKE_TIMEOUT, check=False)
        await delete_netns(ns, None)
        with contextlib.suppress(OSError):
            remove_tree(tmp)
    info["smoke_ms"] = round((time.monotonic() - started) * 1000, 1)
    output = (result.stderr_text + result.stdout_text).strip()
    if result.returncode == 0:
        return {**info, "available": True, "reason": ""}
    if B1_MARKER in output:
        return {**info, "available": False, "bug": "B1", "reason": B1_REASON.format(version=info["version"])}
    return {**info, "available": False, "reason": f"runsc smoke sandbox failed: {output[-500:]}"}

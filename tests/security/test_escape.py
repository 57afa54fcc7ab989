"""Escape probes as root inside real runc and gVisor sandboxes, each asserting containment.

The probes (``probes.py``) run inside; what only the host can see (host uids, host accounts reaching
sandbox files, host network state) is checked here. gVisor answers many probes from its own user-space
kernel, so there "contained" means the host is untouched, which is asserted directly.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.framework.node import Node

PROBES = Path(__file__).with_name("probes.py")

# What gVisor's sentry implements for itself (inside its own kernel, never the host's): these may
# succeed there and are checked by their effect on the host instead.
GVISOR_OWN_KERNEL = {"unshare_user", "unshare_user_then_nft", "mount_proc", "mount_sysfs", "mount_tmpfs",
                     "mount_overlay", "syslog", "read /dev/kmsg", "read /proc/kmsg",
                     "io_uring_setup",  # the sentry's own io_uring, not the host's
                     "lower_oom_score"}  # a score inside the sentry; the host pins the sandbox's (runc checks it)


def run_probes(sbx: Sandbox) -> dict[str, str]:
    sbx.files.write("/root/probes.py", PROBES.read_text(), user="root")
    out = sbx.commands.run("python3 /root/probes.py", user="root", timeout=120)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _host_nft_tables() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout


def test_probes_are_contained(sbx: Sandbox, runtime: str) -> None:
    before_nft = _host_nft_tables()
    results = run_probes(sbx)
    allowed = {k: v for k, v in results.items() if not v.startswith("blocked")}
    if runtime == "gvisor":
        allowed = {k: v for k, v in allowed.items() if k not in GVISOR_OWN_KERNEL}
    assert not allowed, f"escapes on {runtime}: {json.dumps(allowed, indent=1)}"
    assert "wrnprobe" not in _host_nft_tables() and _host_nft_tables() == before_nft
    # The sandbox still works after all that.
    assert sbx.commands.run("echo alive").stdout.strip() == "alive"


def _host_pids_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _host_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def test_sandbox_root_is_not_host_root(sbx: Sandbox, runtime: str) -> None:
    """A process started as root inside runs as a non-zero uid on the host (runc: the sandbox's range;
    gVisor: sandbox processes are not host processes at all, the sentry runs them)."""
    marker = f"wrnmark{secrets.token_hex(4)}"
    sbx.commands.run(f"exec -a {marker} sleep 600", user="root", background=True)
    deadline = time.monotonic() + 20
    pids: list[int] = []
    while not pids and time.monotonic() < deadline:
        pids = _host_pids_with(marker)
        time.sleep(0.1)
    if runtime == "gvisor":
        assert not pids, "a gVisor guest process showed up as a host process"
        return
    assert pids, "the sandbox's process was not found on the host"
    for pid in pids:
        assert _host_uid(pid) >= 65536, f"sandbox root is host uid {_host_uid(pid)}"


def _as_nobody(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` as host account nobody, without capabilities (setpriv would keep them until its exec)."""
    return subprocess.run(argv, user=65534, group=65534, extra_groups=[], capture_output=True, text=True,
                          timeout=30)


def test_sandbox_files_out_of_reach_of_host_accounts(sbx: Sandbox, node: Node, runtime: str) -> None:
    """A setuid binary and a device node made inside cannot be used by a non-root host account."""
    sbx.commands.run("cp /bin/bash /root/suid && chmod 4755 /root/suid", user="root")
    # The device node may not be makeable at all (that is the runc answer); if it is, it must be unusable.
    sbx.commands.run("mknod /root/null c 1 3 2>/dev/null; true", user="root")
    sandbox_dir = node.state_dir / "sandboxes" / sbx.sandbox_id
    found = [p for p in sandbox_dir.rglob("suid") if p.is_file()]
    assert found, f"the setuid copy is not under {sandbox_dir}"
    for path in found:
        st = path.lstat()
        if st.st_uid == 0:
            assert runtime == "gvisor", "a runc sandbox wrote a file owned by host root"
        with pytest.raises(PermissionError):
            _as_nobody([str(path), "-p", "-c", "id -u"])
    for dev in sandbox_dir.rglob("null"):
        r = _as_nobody(["head", "-c", "1", str(dev)])
        assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr
    r = _as_nobody(["cat", str(next(sandbox_dir.rglob("passwd")))])
    assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr
    r = _as_nobody(["ls", str(node.state_dir / "sandboxes")])
    assert r.returncode != 0, f"a host account can list the sandboxes: {r.stdout}"


def test_state_dir_is_sealed(node: Node) -> None:
    """Secrets at rest and everything else under the state dir are root's alone."""
    bad = []
    for path in [node.state_dir, *node.state_dir.iterdir()]:
        st = path.lstat()
        mode = st.st_mode & 0o777
        if path.name == "sandboxes" or path == node.state_dir:
            ok = mode & 0o066 == 0  # searchable (0711) for sandbox ranges, never readable or writable
        else:
            ok = mode & 0o077 == 0
        if not ok:
            bad.append(f"{path} {oct(mode)}")
    assert not bad, bad
    key = node.state_dir / "api-key"  # absent when WARREN_API_KEY gives the key
    assert not key.exists() or key.stat().st_mode & 0o777 == 0o600
    db = next(node.state_dir.glob("*.db"))
    assert db.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("runtime", ["runc"], indirect=True)
def test_health_reports_userns(node: Node, runtime: str) -> None:
    with node.client() as c:
        runc = c.get("/health").json()["runtimes"]["runc"]
    assert runc["userns"]["mode"] == "per-sandbox", runc
    assert runc["hardened"] is True


def test_sudo_and_ownership_inside(sbx: Sandbox, runtime: str) -> None:
    """Inside nothing changes: root and user exist, files keep their owners, user may become root."""
    owners = ("import os; print(*(f'{s.st_uid}:{s.st_gid}' for s in map(os.stat, "
              "['/etc/passwd', '/home/user', os.path.expanduser('~/mine')])))")
    out = sbx.commands.run(f"id -u; touch ~/mine; python3 -c \"{owners}\"").stdout
    assert out.split() == ["1000", "0:0", "1000:1000", "1000:1000"], out
    if runtime == "gvisor":
        pytest.skip("this runsc always sets no_new_privs ('noNewPrivileges ignored. PR_SET_NO_NEW_PRIVS is "
                    "assumed to always be set'), so setuid sudo cannot raise privileges under gVisor")
    root = sbx.commands.run("sudo -n id -u", user="user").stdout.strip()
    assert root == "0"

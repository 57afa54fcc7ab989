"""Which ids the reaper calls orphans: private markers (sandbox dirs, runtime roots) and process evidence
under the shared cgroup parent; everything else under our names is only reported (fake cgroupfs and /proc)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from warren.runtime.base import RuntimeKind
from warren.runtime.cgroups import CgroupHierarchies
from warren.runtime.oci.runtime import OciRuntime
from warren.runtime.reaper import _find_orphans, _names_state_dir, _root_entries, runtime_root

NO_NETNS = "wrunit-no-such-prefix-"


class _Backend:
    def __init__(self, *flags: str) -> None:
        self.flags = flags

    def cli_argv(self, *args: Any) -> list[Any]:
        return ["/usr/bin/x", *self.flags, *args]


def test_runtime_root_is_the_root_flag() -> None:
    assert runtime_root(cast(OciRuntime, _Backend("--root", "/s/runtime/runc"))) == Path("/s/runtime/runc")
    assert runtime_root(cast(OciRuntime, _Backend("--root=/s/runtime/runsc", "--platform=ptrace"))) == Path(
        "/s/runtime/runsc"
    )
    assert runtime_root(cast(OciRuntime, _Backend("--debug"))) is None


def test_root_entries(tmp_path: Path) -> None:
    runc, runsc = tmp_path / "runc", tmp_path / "runsc"
    (runc / "sbx1").mkdir(parents=True)
    (runc / "stray-file").write_text("")
    runsc.mkdir()
    for name in ("sbx2_sandbox:sbx2.state", "sbx2_sandbox:sbx2.lock", "sbx3_sandbox:sbx3.lock", "other.txt"):
        (runsc / name).write_text("")
    assert _root_entries(runc, RuntimeKind.RUNC) == {"sbx1"}
    assert _root_entries(runsc, RuntimeKind.GVISOR) == {"sbx2", "sbx3"}
    assert _root_entries(tmp_path / "missing", RuntimeKind.RUNC) == set()


def _proc(root: Path, pid: int, *, cmdline: bytes = b"", mountinfo: str = "") -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(cmdline)
    (d / "mountinfo").write_text(mountinfo)


def _cgroup(hier_root: Path, rel: str, pids: list[int]) -> None:
    d = hier_root / rel
    d.mkdir(parents=True)
    (d / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))


def test_names_state_dir_needs_the_whole_path(tmp_path: Path) -> None:
    proc, state = tmp_path / "proc", Path("/var/lib/my state")
    _proc(proc, 1, cmdline=b"runsc-sandbox\0--root=/var/lib/my state/runtime/runsc\0boot")
    _proc(proc, 2, mountinfo="75 49 0:39 / / rw - overlay overlay rw,lowerdir=/l,"
                             "upperdir=/var/lib/my\\040state/sandboxes/x/upper,workdir=/w\n")
    _proc(proc, 3, cmdline=b"runsc-gofer\0--root=/var/lib/my state2/runtime/runsc")
    _proc(proc, 4, mountinfo="75 49 0:39 / / rw - overlay overlay rw,upperdir=/var/lib/my\\040state2/sandboxes/x/u\n")
    assert _names_state_dir(1, state, proc)
    assert _names_state_dir(2, state, proc)
    assert not _names_state_dir(3, state, proc)
    assert not _names_state_dir(4, state, proc)
    assert not _names_state_dir(5, state, proc)  # gone


def test_find_orphans(tmp_path: Path) -> None:
    state, proc, cg = tmp_path / "state", tmp_path / "proc", tmp_path / "cgroup"
    for d in ("known1", "orphan-dir"):
        (state / "sandboxes" / d).mkdir(parents=True)
    hier = CgroupHierarchies(v1={"pids": cg / "pids", "memory": cg / "memory"}, v2=None)
    _proc(proc, 901, cmdline=f"runsc-sandbox\0--root={state}/runtime/runsc".encode())
    _proc(proc, 902, mountinfo=f"1 2 0:3 / / rw - overlay overlay rw,upperdir={state}/sandboxes/gone/upper\n")
    _proc(proc, 903, cmdline=f"runsc-sandbox\0--root={state}2/runtime/runsc".encode())
    _proc(proc, 904, cmdline=b"/.agent/bin/python3 -S /.agent/agent.py")
    _cgroup(cg / "pids", "warren/known1", [904])
    _cgroup(cg / "memory", "warren/orphan-root", [])
    _cgroup(cg / "pids", "warren/by-cmdline", [901])
    _cgroup(cg / "memory", "warren/by-mount", [902])
    _cgroup(cg / "pids", "warren/other-node", [903])
    _cgroup(cg / "memory", "warren/other-node", [903])
    _cgroup(cg / "pids", "warren/empty", [])
    _cgroup(cg / "pids", "warren-test/not-under-our-parent", [901])

    orphans, unattributed = _find_orphans(
        frozenset({"known1"}), {"orphan-root"}, state_dir=state, hier=hier, cgroup_parent="warren",
        netns_prefix=NO_NETNS, proc=proc,
    )

    assert orphans == ["by-cmdline", "by-mount", "orphan-dir", "orphan-root"]
    assert sorted(unattributed) == sorted([
        str(cg / "memory" / "warren" / "other-node"), str(cg / "pids" / "warren" / "other-node"),
        str(cg / "pids" / "warren" / "empty"),
    ])

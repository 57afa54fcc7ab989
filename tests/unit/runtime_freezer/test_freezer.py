"""The cgroup freezer warren writes instead of starting ``runc pause`` / ``runc resume``.

The real freezer (cgroup v1 here; v2 where the host has no v1 freezer) is exercised with a busy
process in a cgroup the test makes and removes. The v2 timeout path runs on a plain directory standing
in for a cgroup that never reports ``frozen 1`` (a real cgroup freezes too fast to time out).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren.runtime.cgroups import CgroupHierarchies
from warren.runtime.freezer import Freezer, FreezerError, freezer_of


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@contextlib.contextmanager
def _busy_in_cgroup(h: CgroupHierarchies, rel: str) -> Iterator[tuple[Freezer, subprocess.Popen[bytes]]]:
    root = h.v1["freezer"] if "freezer" in h.v1 else h.v2
    assert root is not None
    top = root / rel
    nested = top / "nested"  # a sandbox with a cgroup namespace may make its own: frozen with the parent
    nested.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        (nested / "cgroup.procs").write_text(str(proc.pid))
        freezer = freezer_of(h, rel)
        assert freezer is not None
        yield freezer, proc
    finally:
        with contextlib.suppress(OSError):
            freezer_of(h, rel).thaw()  # type: ignore[union-attr]
        proc.kill()
        proc.wait()
        for d in (nested, top):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.02)


@pytest.mark.root
def test_freeze_stops_every_task_of_the_cgroup_and_its_children_and_thaw_restarts_them() -> None:
    if os.geteuid() != 0:
        pytest.skip("writing cgroups needs root")
    h = CgroupHierarchies.detect()
    if "freezer" not in h.v1 and h.v2 is None:
        pytest.skip("no cgroup freezer on this host")
    with _busy_in_cgroup(h, f"warren-test-freezer-{os.getpid()}") as (freezer, proc):
        freezer.freeze()
        assert freezer.frozen()
        before = _cpu_ticks(proc.pid)
        time.sleep(0.3)
        assert _cpu_ticks(proc.pid) == before, "a frozen task kept running"
        freezer.thaw()
        assert not freezer.frozen()
        time.sleep(0.3)
        assert _cpu_ticks(proc.pid) > before, "a thawed task did not run again"


def test_no_freezer_for_a_cgroup_that_does_not_exist(tmp_path: Path) -> None:
    h = CgroupHierarchies(v1={"freezer": tmp_path / "freezer"}, v2=None)
    assert freezer_of(h, "warren/nope") is None
    assert freezer_of(CgroupHierarchies(v1={}, v2=tmp_path), "warren/nope") is None
    assert freezer_of(CgroupHierarchies(v1={}, v2=None), "warren/nope") is None


def test_v2_freeze_waits_for_the_frozen_event(tmp_path: Path) -> None:
    (tmp_path / "cgroup.freeze").write_text("0")
    (tmp_path / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    freezer = freezer_of(CgroupHierarchies(v1={}, v2=tmp_path.parent), tmp_path.name)
    assert freezer == Freezer(tmp_path, v1=False)
    freezer.freeze(timeout_s=1)
    assert (tmp_path / "cgroup.freeze").read_text() == "1"
    assert freezer.frozen()


def test_a_freeze_that_never_completes_is_thawed_again_and_raises(tmp_path: Path) -> None:
    (tmp_path / "cgroup.freeze").write_text("0")
    (tmp_path / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    freezer = Freezer(tmp_path, v1=False)
    with pytest.raises(FreezerError, match="not frozen"):
        freezer.freeze(timeout_s=0.05)
    assert (tmp_path / "cgroup.freeze").read_text() == "0"


def test_v1_state_file(tmp_path: Path) -> None:
    (tmp_path / "freezer.state").write_text("THAWED\n")
    h = CgroupHierarchies(v1={"freezer": tmp_path.parent}, v2=None)
    freezer = freezer_of(h, tmp_path.name)
    assert freezer == Freezer(tmp_path, v1=True)
    freezer.freeze(timeout_s=1)  # a plain file reads back what was written: FROZEN at once
    assert freezer.frozen()
    freezer.thaw(timeout_s=1)
    assert (tmp_path / "freezer.state").read_text() == "THAWED"

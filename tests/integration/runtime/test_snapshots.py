"""snapshot/restore: runc copies the upper dir of a frozen sandbox; gVisor adds a memory image and keeps
the source running (restored in place at a new address); a snapshot restores into any number of
independent sandboxes, is never modified, and a failed restore leaves nothing behind."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.framework.agent import wait_for_health
from tests.framework.leaks import assert_no_leaks
from tests.framework.runtime import SandboxFactory, exec_in, host_snapshot
from warren.errors import InvalidRequestError, InvalidStateError, NotFoundError, RuntimeFailure
from warren.runtime.base import PauseMode, RuntimeKind, SandboxHandle
from warren.runtime.oci.snapshots import SnapshotMeta, open_snapshot

root = pytest.mark.root
runc = pytest.mark.runc
runsc = pytest.mark.runsc

COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /dev/shm/counter; sleep 0.05; done >/dev/null 2>&1 &"
"""A process whose state lives only in memory: its shell variable, and /dev/shm (a tmpfs) for reading it."""


async def _healthy(handle: SandboxHandle) -> None:
    async with asyncio.timeout(30):
        await wait_for_health(handle.address, handle.agent_port)


async def _sh(factory: SandboxFactory, sandbox_id: str, script: str, *, check: bool = True) -> str:
    return (await exec_in(factory.runtime, sandbox_id, ["/bin/sh", "-c", script], check=check)).stdout_text


async def _restore(factory: SandboxFactory, snapshot: Path) -> SandboxHandle:
    """Restore into a new sandbox that the factory stops (and leak-checks) at teardown."""
    spec = factory.spec()
    factory.started.append(spec.sandbox_id)
    factory.specs[spec.sandbox_id] = spec
    handle = await factory.runtime.restore(spec, snapshot)
    await _healthy(handle)
    return handle


async def _counter(factory: SandboxFactory, sandbox_id: str) -> int:
    async with asyncio.timeout(20):
        while True:  # empty while the loop rewrites it (truncate, then write)
            text = await _sh(factory, sandbox_id, "cat /dev/shm/counter")
            if text.strip():
                return int(text)


async def _counter_at_least(factory: SandboxFactory, sandbox_id: str, value: int) -> int:
    async with asyncio.timeout(20):
        while True:
            now = await _counter(factory, sandbox_id)
            if now >= value:
                return now
            await asyncio.sleep(0.05)


def _tree(top: Path) -> dict[str, Any]:
    """Everything about a directory tree a snapshot must keep: types, modes, owners, times, links,
    xattrs and contents."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            xattrs = {k: os.getxattr(path, k, follow_symlinks=False) for k in os.listxattr(path, follow_symlinks=False)}
            if stat.S_ISREG(st.st_mode):
                body = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                body = os.readlink(path)
            else:
                body = st.st_rdev
            out[os.path.relpath(path, top)] = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, body, xattrs)
    return out


# ------------------------------------------------------------------ runc


@root
@runc
async def test_runc_snapshot_restores_the_files_and_keeps_the_source(runc_sandboxes: SandboxFactory,
                                                                     tmp_path: Path) -> None:
    runtime = runc_sandboxes.runtime
    src = await runc_sandboxes.start()
    await _healthy(src)
    sid = src.sandbox_id
    # A file, a hard link, an owner, a setuid mode, a symlink, a whiteout (/bin/ls of the lower layer)
    # and an opaque dir (/usr/sbin replaced): the overlay xattrs and 0/0 devices must survive the copy.
    await _sh(runc_sandboxes, sid, "echo one > /root/file && ln /root/file /root/link && "
              "echo u > /home/user/f && chown 1000:1000 /home/user/f && chmod 4750 /home/user/f && "
              "ln -s /root/file /root/sym && rm /bin/ls && rm -rf /usr/sbin && mkdir /usr/sbin && "
              "echo only > /usr/sbin/only")
    dest = tmp_path / "snap"
    dest.mkdir()
    contents = await runtime.snapshot(sid, dest)
    assert (contents.memory, contents.runtime) == (False, RuntimeKind.RUNC)
    assert contents.bytes > 0
    assert contents.source is not None and contents.source.address == src.address
    assert sorted(p.name for p in dest.iterdir()) == ["meta.json", "upper"]
    meta = SnapshotMeta.from_json((dest / "meta.json").read_text())
    assert (meta.kind, meta.memory, meta.source_id, meta.source_state) == (RuntimeKind.RUNC, False, sid, "running")
    assert _tree(dest / "upper") == _tree(runtime.sandbox_paths(sid).upper)
    frozen = _tree(dest)

    # The source was thawed and still writes.
    assert await runtime.state(sid) == "running"
    await _sh(runc_sandboxes, sid, "echo two > /root/after")
    await _healthy(src)

    clone = await _restore(runc_sandboxes, dest)
    assert clone.address != src.address
    out = await _sh(runc_sandboxes, clone.sandbox_id,
                    "cat /root/file; stat -c '%i' /root/file /root/link | uniq | wc -l; "
                    "stat -c '%u:%g %a' /home/user/f; readlink /root/sym; ls /usr/sbin; "
                    "test -e /bin/ls && echo ls-back; test -e /root/after && echo leaked; true")
    assert out == "one\n1\n1000:1000 4750\n/root/file\nonly\n"

    # Writes in the clone reach neither the source nor the snapshot, and the reverse.
    await _sh(runc_sandboxes, clone.sandbox_id, "echo clone > /root/clone; echo changed > /root/file")
    assert await _sh(runc_sandboxes, sid, "cat /root/file; test -e /root/clone && echo leaked; true") == "one\n"
    assert _tree(dest) == frozen


@root
@runc
async def test_runc_snapshot_restored_twice_at_once(runc_sandboxes: SandboxFactory, tmp_path: Path) -> None:
    runtime = runc_sandboxes.runtime
    src = await runc_sandboxes.start()
    await _healthy(src)
    await _sh(runc_sandboxes, src.sandbox_id, "echo base > /root/base")
    dest = tmp_path / "snap"
    dest.mkdir()
    await runtime.snapshot(src.sandbox_id, dest)
    frozen = _tree(dest)
    a, b = await asyncio.gather(_restore(runc_sandboxes, dest), _restore(runc_sandboxes, dest))
    assert len({src.address, a.address, b.address}) == 3
    await asyncio.gather(_sh(runc_sandboxes, a.sandbox_id, "echo a > /root/who"),
                         _sh(runc_sandboxes, b.sandbox_id, "echo b > /root/who"))
    for handle, who in ((a, "a"), (b, "b")):
        assert await _sh(runc_sandboxes, handle.sandbox_id, "cat /root/base /root/who") == f"base\n{who}\n"
    assert await _sh(runc_sandboxes, src.sandbox_id, "cat /root/who 2>/dev/null; true") == ""
    assert _tree(dest) == frozen


@root
@runc
async def test_runc_snapshot_of_a_paused_sandbox(runc_sandboxes: SandboxFactory, tmp_path: Path) -> None:
    runtime = runc_sandboxes.runtime
    src = await runc_sandboxes.start()
    await _healthy(src)
    await _sh(runc_sandboxes, src.sandbox_id, "echo kept > /root/kept")
    for mode in PauseMode:
        await runtime.pause(src.sandbox_id, mode)
        dest = tmp_path / f"snap-{mode}"
        dest.mkdir()
        contents = await runtime.snapshot(src.sandbox_id, dest)
        assert (contents.memory, contents.source) == (False, None)
        assert await runtime.state(src.sandbox_id) == "paused"
        assert await runtime.locate(src.sandbox_id) is None
        assert (dest / "upper" / "root" / "kept").read_text() == "kept\n"
        resumed = await runtime.resume(runc_sandboxes.specs[src.sandbox_id], mode)
        await _healthy(resumed)
        assert await runtime.locate(src.sandbox_id) == resumed


@root
@runc
async def test_snapshot_refuses_a_bad_destination_or_sandbox(runc_sandboxes: SandboxFactory, tmp_path: Path) -> None:
    runtime = runc_sandboxes.runtime
    src = await runc_sandboxes.start()
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    with pytest.raises(InvalidRequestError):
        await runtime.snapshot(src.sandbox_id, full)
    with pytest.raises(InvalidRequestError):
        await runtime.snapshot(src.sandbox_id, tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NotFoundError):
        await runtime.snapshot("nope", empty)
    assert sorted(p.name for p in full.iterdir()) == ["x"]


@root
@runc
async def test_restore_without_upper_fails_and_leaves_nothing(runc_sandboxes: SandboxFactory, tmp_path: Path) -> None:
    runtime = runc_sandboxes.runtime
    before = host_snapshot(runtime.state_dir)
    empty = tmp_path / "empty-snapshot"
    empty.mkdir()
    with pytest.raises(RuntimeFailure, match="upper"):
        await runtime.restore(runc_sandboxes.spec(), empty)
    # A memory image is for gVisor only; runc refuses it before making anything.
    (empty / "upper").mkdir()
    (empty / "checkpoint").mkdir()
    with pytest.raises(InvalidRequestError, match="gVisor"):
        await runtime.restore(runc_sandboxes.spec(), empty)
    assert_no_leaks(before)


def test_meta_checks_of_a_memory_image(tmp_path: Path, agent_bundle: Path) -> None:
    """``open_snapshot`` refuses a memory image made with another platform or agent bundle."""
    snap = tmp_path / "snap"
    (snap / "upper").mkdir(parents=True)
    (snap / "checkpoint").mkdir()
    meta = {"format": 1, "kind": "gvisor", "memory": True, "platform": "ptrace", "runtime_binary": "/x",
            "runtime_version": None, "agent_bundle": str(agent_bundle), "agent_bundle_id": agent_bundle.name,
            "resources": {"cpu_count": 1, "memory_mb": 256, "pids_max": 64, "disk_mb": 10}, "source_id": "s",
            "source_state": "running", "created_at": 0.0}
    (snap / "meta.json").write_text(json.dumps(meta))
    found = open_snapshot(snap, kind=RuntimeKind.GVISOR, platform="ptrace", agent_bundle=agent_bundle)
    assert (found.upper, found.image) == (snap / "upper", snap / "checkpoint")
    with pytest.raises(InvalidRequestError, match="platform"):
        open_snapshot(snap, kind=RuntimeKind.GVISOR, platform="kvm", agent_bundle=agent_bundle)
    with pytest.raises(InvalidRequestError, match="bundle"):
        open_snapshot(snap, kind=RuntimeKind.GVISOR, platform="ptrace", agent_bundle=tmp_path / "agent-other")
    (snap / "meta.json").write_text(json.dumps({**meta, "memory": False}))
    assert open_snapshot(snap, kind=RuntimeKind.RUNC, platform="ptrace", agent_bundle=agent_bundle).image is None
    (snap / "meta.json").write_text("{not json")
    with pytest.raises(RuntimeFailure, match="meta"):
        open_snapshot(snap, kind=RuntimeKind.GVISOR, platform="ptrace", agent_bundle=agent_bundle)


# ------------------------------------------------------------------ gVisor


async def _counting_sandbox(factory: SandboxFactory) -> tuple[SandboxHandle, int]:
    src = await factory.start()
    await _healthy(src)
    await _sh(factory, src.sandbox_id, "echo disk > /root/disk; " + COUNTER)
    return src, await _counter_at_least(factory, src.sandbox_id, 20)


@root
@runsc
async def test_gvisor_snapshot_keeps_memory_and_the_source_running(runsc_sandboxes: SandboxFactory,
                                                                   tmp_path: Path) -> None:
    runtime = runsc_sandboxes.runtime
    src, _ = await _counting_sandbox(runsc_sandboxes)
    sid = src.sandbox_id
    work = tmp_path / "work"
    work.mkdir()
    before = await _counter(runsc_sandboxes, sid)
    contents = await runtime.snapshot(sid, work)
    assert (contents.memory, contents.runtime) == (True, RuntimeKind.GVISOR)
    assert (work / "checkpoint" / "checkpoint.img").is_file()
    assert (work / "upper" / "root" / "disk").read_text() == "disk\n"
    meta = SnapshotMeta.from_json((work / "meta.json").read_text())
    assert (meta.kind, meta.memory, meta.platform, meta.agent_bundle_id) == (
        RuntimeKind.GVISOR, True, runtime.platform, runtime.agent_bundle.name)

    # The source was restored in place: a new address, the same memory, still counting.
    source = contents.source
    assert source is not None and source.sandbox_id == sid
    assert await runtime.locate(sid) == source
    await _healthy(source)
    assert await _counter(runsc_sandboxes, sid) >= before
    await _counter_at_least(runsc_sandboxes, sid, before + 10)

    # The caller moves the directory into its repository: nothing of the source depends on the path.
    snap = tmp_path / "repo" / "snap"
    snap.parent.mkdir()
    work.rename(snap)
    frozen = _tree(snap)
    clone = await _restore(runsc_sandboxes, snap)
    counted = await _counter(runsc_sandboxes, clone.sandbox_id)
    assert counted >= before  # continued from its value: a fresh loop would have no /dev/shm/counter at all
    await _counter_at_least(runsc_sandboxes, clone.sandbox_id, counted + 10)
    assert await _sh(runsc_sandboxes, clone.sandbox_id, "cat /root/disk") == "disk\n"

    await _sh(runsc_sandboxes, clone.sandbox_id, "echo clone > /root/clone; echo clone > /tmp/clone")
    assert await _sh(runsc_sandboxes, sid, "cat /root/clone /tmp/clone 2>/dev/null; true") == ""
    assert _tree(snap) == frozen

    # The image may go away once restored: both sandboxes keep running.
    shutil.rmtree(snap)
    for handle in (source, clone):
        await _healthy(handle)
        now = await _counter(runsc_sandboxes, handle.sandbox_id)
        await _counter_at_least(runsc_sandboxes, handle.sandbox_id, now + 5)


@root
@runsc
async def test_gvisor_image_restored_twice_at_once(runsc_sandboxes: SandboxFactory, tmp_path: Path) -> None:
    runtime = runsc_sandboxes.runtime
    src, _ = await _counting_sandbox(runsc_sandboxes)
    snap = tmp_path / "snap"
    snap.mkdir()
    await runtime.snapshot(src.sandbox_id, snap)
    a, b = await asyncio.gather(_restore(runsc_sandboxes, snap), _restore(runsc_sandboxes, snap))
    assert len({a.address, b.address}) == 2
    await asyncio.gather(_sh(runsc_sandboxes, a.sandbox_id, "echo a > /tmp/who; echo a > /root/who"),
                         _sh(runsc_sandboxes, b.sandbox_id, "echo b > /tmp/who; echo b > /root/who"))
    for handle, who in ((a, "a"), (b, "b")):
        assert await _sh(runsc_sandboxes, handle.sandbox_id, "cat /tmp/who /root/who") == f"{who}\n{who}\n"
        now = await _counter(runsc_sandboxes, handle.sandbox_id)
        await _counter_at_least(runsc_sandboxes, handle.sandbox_id, now + 5)
    # Entropy: the kernel's random pool is not part of the image (the sentry reads the host's).
    rand = "head -c 16 /dev/urandom | od -An -tx1"
    assert await _sh(runsc_sandboxes, a.sandbox_id, rand) != await _sh(runsc_sandboxes, b.sandbox_id, rand)


@root
@runsc
async def test_gvisor_snapshot_of_a_checkpointed_sandbox(runsc_sandboxes: SandboxFactory, tmp_path: Path) -> None:
    runtime = runsc_sandboxes.runtime
    src, _ = await _counting_sandbox(runsc_sandboxes)
    sid = src.sandbox_id
    await runtime.pause(sid, PauseMode.MEMORY)
    own = runtime.sandbox_paths(sid).checkpoint
    kept = _tree(own)
    snap = tmp_path / "snap"
    snap.mkdir()
    contents = await runtime.snapshot(sid, snap)
    assert (contents.memory, contents.source) == (True, None)
    assert await runtime.state(sid) == "paused"
    assert _tree(own) == kept
    assert _tree(snap / "checkpoint") == kept
    assert SnapshotMeta.from_json((snap / "meta.json").read_text()).source_state == "paused"

    clone = await _restore(runsc_sandboxes, snap)
    counted = await _counter(runsc_sandboxes, clone.sandbox_id)
    await _counter_at_least(runsc_sandboxes, clone.sandbox_id, counted + 5)
    resumed = await runtime.resume(runsc_sandboxes.specs[sid], PauseMode.MEMORY)
    await _healthy(resumed)
    assert await _counter(runsc_sandboxes, sid) >= counted - 5  # the same value at the pause, give or take


@root
@runsc
async def test_gvisor_failed_checkpoint_destroys_the_source_cleanly(runsc_sandboxes: SandboxFactory,
                                                                    tmp_path: Path) -> None:
    """An open connection makes the checkpoint fail and kills the sandbox (B3): RuntimeFailure, an
    empty destination, no container or network left, and stop() removes the rest."""
    runtime = runsc_sandboxes.runtime
    before = host_snapshot(runtime.state_dir)
    src = await runsc_sandboxes.start()
    await _healthy(src)
    _reader, writer = await asyncio.open_connection(src.address, src.agent_port)
    try:
        snap = tmp_path / "snap"
        snap.mkdir()
        with pytest.raises(RuntimeFailure, match="checkpoint"):
            await runtime.snapshot(src.sandbox_id, snap)
        assert list(snap.iterdir()) == []
        assert await runtime.state(src.sandbox_id) is None
        assert await runtime.locate(src.sandbox_id) is None
        with pytest.raises(InvalidStateError):
            await runtime.snapshot(src.sandbox_id, snap)
    finally:
        writer.close()
    await runtime.stop(src.sandbox_id)
    assert_no_leaks(before)


@root
@runsc
async def test_gvisor_restore_of_a_corrupt_image_fails_and_leaves_nothing(runsc_sandboxes: SandboxFactory,
                                                                          tmp_path: Path) -> None:
    runtime = runsc_sandboxes.runtime
    before = host_snapshot(runtime.state_dir)
    snap = tmp_path / "snap"
    (snap / "upper" / "root").mkdir(parents=True)
    (snap / "checkpoint").mkdir()
    (snap / "checkpoint" / "checkpoint.img").write_bytes(os.urandom(64 * 1024))
    with pytest.raises(RuntimeFailure, match="restoring container"):
        await runtime.restore(runsc_sandboxes.spec(), snap)
    assert_no_leaks(before)

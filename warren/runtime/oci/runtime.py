"""``OciRuntime``: the Runtime protocol on top of runc or runsc (gVisor, ptrace platform).

Usage::

    network = NetworkManager(NetConfig())
    await network.setup()
    bundle = await build_agent_bundle(cache_dir, guest_src)
    runc = OciRuntime(RuntimeKind.RUNC, Path("/usr/sbin/runc"), state_dir, bundle, network)
    await runc.setup()                       # dirs + probe; runc.probe() is then the cached result
    handle = await runc.start(SandboxSpec("sbx1", RuntimeKind.RUNC, layers=(rootfs,)))
    ...                                      # the agent answers at handle.address:handle.agent_port
    await runc.stop("sbx1")

Pausing: ``PauseMode.MEMORY`` is the freezer on runc (same address after resume) and a checkpoint to
``sandboxes/<id>/checkpoint/`` on gVisor (the restore gets a fresh netns, so the address changes; a
failed checkpoint destroys the sandbox, guest-agent-notes B3). A gVisor pause answers once the image
is written; the release of the stopped container, its cgroups, mount and netns then runs in a task the
backend owns (:mod:`warren.runtime.oci.releases`), and resume, snapshot and stop of that sandbox wait
for it. ``PauseMode.FILESYSTEM`` ends every process and keeps the upper dir; resume starts the agent
afresh. The on-disk layout is described in
:mod:`warren.runtime.oci.layout`.

Snapshots (:meth:`OciRuntime.snapshot`, :meth:`OciRuntime.restore`; format in
:mod:`warren.runtime.oci.snapshots`): runc freezes the sandbox, copies its upper dir and thaws it (files
only: CRIU is not usable here). A running gVisor sandbox is checkpointed into the snapshot, its upper dir
copied, and then restored from that image into a fresh netns, so it keeps running at a new address
(``SnapshotContents.source``). A paused sandbox is copied as it is. A restore makes a new sandbox on a copy
of the snapshot's upper dir; with a memory image its processes continue where they were.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from warren import phases, treecopy
from warren.errors import (
    InvalidRequestError,
    InvalidStateError,
    NotFoundError,
    RuntimeFailure,
)
from warren.runtime.base import (
    AGENT_PORT,
    PauseMode,
    RuntimeKind,
    RuntimeProbe,
    RuntimeState,
    SandboxHandle,
    SandboxSpec,
    SandboxStats,
    SnapshotContents,
)
from warren.runtime.net.netns import delete_netns
from warren.runtime.oci.backend import OciBackendBase
from warren.runtime.oci.command import run_command
from warren.runtime.oci.layout import SandboxPaths, SandboxRecord, validate_sandbox_id
from warren.runtime.oci.snapshots import (
    CHECKPOINT,
    UPPER,
    check_empty_dir,
    clear_dir,
    copy_tree,
    new_meta,
    open_snapshot,
)
from warren.runtime.oci.steps import (
    as_runtime_failure,
    load_record,
    read_pid,
    remove_tree,
    set_aside_unreadable,
    undo_step,
)
from warren.runtime.probe import probe_runc, probe_runsc
from warren.runtime.rootfs import directory_usage
from warren.runtime.userns import probe_idmapped_mounts, to_neutral, unsearchable_ancestor
from warren.trees import QUARANTINE, shift_owner

__all__ = ["OciRuntime"]

_log = logging.getLogger(__name__)

CHECKPOINT_TIMEOUT = 120.0
"""gVisor writes the whole sandbox memory; ~0.1 s for an idle agent, longer for GBs of guest memory."""

MIB = 1024 * 1024


class OciRuntime(OciBackendBase):
    """Sandboxes under runc (``kind=RUNC``) or runsc (``kind=GVISOR``); see the module docstring."""

    # ------------------------------------------------------------------ the backend itself

    async def setup(self) -> Mapping[str, Any]:
        """Create the state dirs and run the startup probe; returns (and caches) the probe result."""
        for d in (self._root, self._sandboxes):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Searchable, not listable: a sandbox's runtime resolves its bundle paths from inside its user
        # namespace, as its range's root; each sandbox dir below is 0700 and owned by that range.
        self._sandboxes.chmod(0o711)
        self._root.chmod(0o700)
        if self._uid_ranges is not None:
            blocked = unsearchable_ancestor(self.state_dir)
            reason = (f"{blocked} is not searchable by other users, so a sandbox's root cannot reach its "
                      f"bundle under the state dir: chmod o+x {blocked}") if blocked else ""
            reason = reason or await asyncio.to_thread(
                probe_idmapped_mounts, self.state_dir / "probe" / f"idmap-{os.getpid()}")
            if reason:
                _log.warning("runc sandboxes run without user namespaces: %s", reason)
                self._uid_ranges, self._userns_reason = None, reason
        if self.kind is RuntimeKind.RUNC:
            result = await probe_runc(self.binary)
        else:
            result = await probe_runsc(
                self.binary, work_dir=self.state_dir / "probe", platform=self.platform,
                netns_prefix=self._network.config.netns_prefix, agent_bundle=self.agent_bundle,
            )
        result["oom_protected_agent"] = self._oom_score_adj is not None
        result["hardened"] = self.hardened
        result["userns"] = self.userns_status()
        result["disk_quota"] = await asyncio.to_thread(self.disks.probe)
        self._probe = result
        return result

    def set_unavailable(self, reason: str) -> None:
        """Record a failed probe without running one (e.g. the binary or networking is missing)."""
        self._probe = {"available": False, "reason": reason, "kind": str(self.kind), "binary": str(self.binary)}

    def probe(self) -> RuntimeProbe:
        """The result of :meth:`setup`'s probe, or "not probed" before it ran."""
        if self._probe is None:
            return RuntimeProbe(False, "not probed yet", {"kind": str(self.kind)})
        return RuntimeProbe.of_mapping(self._probe)

    async def recover(self) -> list[str]:
        """Reload the records of sandboxes left on disk by a previous process; return their ids.

        Their pool slots are reserved again. The caller decides to keep (state()) or stop() each one.
        """
        ids = []
        for child in sorted(self._sandboxes.iterdir()) if self._sandboxes.is_dir() else []:
            record = load_record(SandboxPaths(child))
            if record is None:  # garbage must not stop the node: unreadable ones are moved aside
                await asyncio.to_thread(set_aside_unreadable, SandboxPaths(child), self._sandboxes.parent / QUARANTINE)
                continue
            if record.kind is not self.kind:
                continue
            if record.network is not None:
                self._network.adopt(record.network)
                try:
                    await self._network.adopt_egress(record.network)
                except RuntimeFailure as exc:  # the sandbox stays; its policy is enforced at the next update
                    _log.error("egress policy of sandbox %s not restored: %s", record.sandbox_id, exc)
            if record.uid_range is not None and self._uid_ranges is not None:
                self._uid_ranges.adopt(record.uid_range)
            self._records[record.sandbox_id] = record
            ids.append(record.sandbox_id)
            try:  # mounts survive a restart of warren, not a reboot of the host
                await asyncio.to_thread(self.disks.attach, child)
            except (OSError, RuntimeFailure) as exc:
                _log.error("the disk of sandbox %s cannot be mounted again: %s", record.sandbox_id, exc)
        return ids

    # ------------------------------------------------------------------ Runtime protocol

    async def start(self, spec: SandboxSpec) -> SandboxHandle:
        """Create the sandbox's netns, overlay, bundle and container; the agent is starting on return.

        Raises ``InvalidRequestError`` (bad id / wrong kind), ``UnavailableError`` (the probe failed),
        ``ConflictError`` (the id exists), or ``RuntimeFailure`` after removing everything it made.
        """
        self._check_spec(spec)
        async with self._lock(spec.sandbox_id), as_runtime_failure(f"starting sandbox {spec.sandbox_id}"):
            return await self._create(spec, upper_from=None, image=None)

    async def stop(self, sandbox_id: str) -> None:
        """Kill the container and remove everything the sandbox owns. Idempotent.

        Every step runs even if an earlier one failed; a step that fails raises ``RuntimeFailure`` at
        the end (and the record is kept so that a retry can finish the job).
        """
        try:
            paths = self.sandbox_paths(sandbox_id)
        except InvalidRequestError:
            return  # such a sandbox cannot exist
        async with self._lock(sandbox_id):
            await self._releases.wait(sandbox_id)  # then every step below finds what it left, if anything
            record = self._records.get(sandbox_id) or load_record(paths)
            if record is not None and record.kind is not self.kind:
                return  # the other backend's sandbox (they share the sandboxes dir): not ours to touch
            errors: list[str] = []

            async def step(what: str, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
                try:
                    await fn(*args)
                except Exception as exc:
                    errors.append(f"{what}: {exc}")

            await step("container", self._cli_of(sandbox_id).delete, sandbox_id)
            await step("overlay", self._unmount, paths.rootfs)
            await step("disk", self._release_disk, paths.root)
            if record is not None and record.network is not None:
                await step("network", self._network.destroy, record.network)
            # By name too: covers a record lost in a crash (the veth dies with its netns).
            await step("netns", delete_netns, self._network.netns_name(sandbox_id), None)
            await step("cgroups", self._remove_cgroups, sandbox_id)
            if not errors:
                await step("files", self._remove_dir, paths.root)
            if errors:
                raise RuntimeFailure(f"stopping sandbox {sandbox_id} left resources: {'; '.join(errors)}")
            self._records.pop(sandbox_id, None)
            if record is not None:
                self._release_range(record.uid_range)

    async def state(self, sandbox_id: str) -> RuntimeState | None:
        """``running``, ``paused`` or ``stopped``; None when neither warren nor the runtime knows the id."""
        try:
            validate_sandbox_id(sandbox_id)
        except InvalidRequestError:
            return None
        record = self._record(sandbox_id)
        if record is not None and record.paused is not None and not self._freezes(record.paused):
            return RuntimeState.PAUSED  # no container exists while checkpointed or paused without processes
        status = await self._cli_of(sandbox_id).state(sandbox_id)
        return RuntimeState(status) if status is not None else None

    async def stats(self, sandbox_id: str) -> SandboxStats:
        """CPU, memory (from the cgroup) and disk (the upper dir) of a sandbox this backend started."""
        paths = self.sandbox_paths(sandbox_id)
        record = self._record(sandbox_id)
        if record is None:
            raise NotFoundError(f"no sandbox {sandbox_id} on this node")
        res = record.resources
        usage = await asyncio.to_thread(self._cgroups.usage, self._cgroup_rel(sandbox_id))
        on_disk = await asyncio.to_thread(self.disks.usage, paths.root)
        disk, disk_total = on_disk or (await asyncio.to_thread(directory_usage, paths.upper), res.disk_mb * MIB)
        return SandboxStats(
            cpu_count=res.cpu_count,
            cpu_usage_ns=usage.cpu_usage_ns if usage else 0,
            memory_used=usage.memory_usage if usage else 0,
            memory_total=(usage.memory_limit if usage and usage.memory_limit else res.memory_mb * MIB),
            memory_cache=usage.memory_cache if usage else 0,
            disk_used=disk,
            disk_total=disk_total,
        )

    async def pause(self, sandbox_id: str, mode: PauseMode) -> None:
        """Freeze (runc MEMORY), checkpoint (gVisor MEMORY) or end the processes (FILESYSTEM).

        gVisor refuses to checkpoint while any TCP connection is established (B3): close the proxy's
        and the node's connections to the agent first. A failed checkpoint kills the sandbox; its
        network and container are then removed and ``RuntimeFailure`` is raised (``state()`` is None).
        A checkpoint that succeeded returns at once: ``runsc delete`` (which waits until the stopped
        sandbox process is reaped), the mount, cgroups and netns are released in the background, and a
        failure there is logged and retried by the sandbox's next resume, snapshot or stop.
        """
        paths = self.sandbox_paths(sandbox_id)
        async with self._lock(sandbox_id), as_runtime_failure(f"pausing sandbox {sandbox_id}"):
            record = self._record(sandbox_id)
            if record is None:
                raise NotFoundError(f"no sandbox {sandbox_id} on this node")
            if record.paused is not None:
                raise InvalidStateError(f"sandbox {sandbox_id} is already paused")
            if self._freezes(mode):
                with phases.phase("runtime.freeze"):
                    await self._freeze(sandbox_id)
            elif mode is PauseMode.MEMORY:
                await asyncio.to_thread(remove_tree, paths.checkpoint)
                try:
                    argv = self._cli_of(sandbox_id).argv("checkpoint", f"--image-path={paths.checkpoint}", sandbox_id)
                    await run_command(argv, timeout=CHECKPOINT_TIMEOUT, output=paths.log)
                except RuntimeFailure:
                    if await self.state(sandbox_id) != "running":
                        await self._release(record, paths, paused=None)
                    raise
                # The processes are gone and the image is written: the pause is done. The record says
                # the release is pending (paused, network still set) until the release clears it.
                record = replace(record, paused=mode)
                await self._save(paths, record)
                await self._releases.start(sandbox_id, functools.partial(self._release, record, paths, paused=mode))
                return
            else:
                await self._release(record, paths, paused=mode)
                return
            with phases.phase("runtime.save"):
                await self._save(paths, replace(record, paused=mode))

    async def resume(self, spec: SandboxSpec, mode: PauseMode) -> SandboxHandle:
        """Undo :meth:`pause`. After a checkpoint or a FILESYSTEM pause the sandbox gets a fresh netns,
        so ``handle.address`` may differ. On failure the sandbox stays paused and can be resumed again."""
        sid = spec.sandbox_id
        paths = self.sandbox_paths(sid)
        async with self._lock(sid), as_runtime_failure(f"resuming sandbox {sid}"):
            with phases.phase("runtime.settle"):
                record = await self._settle(sid)
            if record is None:
                raise NotFoundError(f"no sandbox {sid} on this node")
            if record.paused is None:
                raise InvalidStateError(f"sandbox {sid} is not paused")
            if record.paused is not mode:
                _log.warning("resuming %s as %s, the mode it was paused with (asked: %s)", sid, record.paused, mode)
            if self._freezes(record.paused) and record.network is not None:
                net = record.network
                if net.egress != spec.egress:
                    net = await self._network.set_egress(net, spec.egress)
                with phases.phase("runtime.thaw"):
                    await self._thaw(sid)
                with phases.phase("runtime.save"):
                    await self._save(paths, replace(record, paused=None, network=net))
                return SandboxHandle(sid, self.kind, record.network.guest_ip, AGENT_PORT, read_pid(paths.pid_file))
            restore = paths.checkpoint if record.paused is PauseMode.MEMORY else None
            async with contextlib.AsyncExitStack() as undo:
                undo.push_async_callback(undo_step, "record", self._save, paths, record)
                with phases.phase("runtime.launch"):
                    handle = await self._launch(spec, paths, undo, restore=restore, uid_range=record.uid_range)
                undo.pop_all()
            if restore is not None:
                await asyncio.to_thread(remove_tree, restore)
            return handle

    async def export_filesystem(self, sandbox_id: str, dest: Path) -> None:
        """The upper dir of a sandbox paused without processes, re-owned in place from its user namespace
        range to the ids seen inside (0-based), moved to the new dir ``dest``, or copied by a child process
        a cancellation kills (:mod:`warren.treecopy`) when ``dest`` is on another filesystem."""
        paths = self.sandbox_paths(sandbox_id)
        async with self._lock(sandbox_id):
            record = await self._settle(sandbox_id)
            if record is None:
                raise NotFoundError(f"no sandbox {sandbox_id} on this node")
            if record.network is not None:
                raise InvalidStateError(f"sandbox {sandbox_id} still runs; pause it without its processes first")
            rng = record.uid_range
            if rng is not None:
                await asyncio.to_thread(shift_owner, paths.upper, -rng.host, -rng.host,
                                        within=range(rng.host, rng.host + rng.size))
                await self._save(paths, replace(record, uid_range=None))
                self._release_range(rng)
            if await asyncio.to_thread(os.path.lexists, dest):
                raise InvalidRequestError(f"cannot export {sandbox_id} to {dest}: it exists")
            try:
                await asyncio.to_thread(os.rename, paths.upper, dest)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise RuntimeFailure(f"cannot move the filesystem of {sandbox_id} to {dest}: {exc}") from exc
                await treecopy.copy_tree(paths.upper, dest)

    async def locate(self, sandbox_id: str) -> SandboxHandle | None:
        """The handle of a running sandbox as it is now (a gVisor snapshot moves it to a new address and
        init pid); None when it is unknown, paused or not running."""
        try:
            paths = self.sandbox_paths(sandbox_id)
        except InvalidRequestError:
            return None
        record = self._record(sandbox_id)
        if record is None or record.network is None or record.paused is not None:
            return None
        if await self._cli_of(sandbox_id).state(sandbox_id) != "running":
            return None
        return self._handle(record, paths)

    async def snapshot(self, sandbox_id: str, dest: Path) -> SnapshotContents:
        """Fill the empty directory ``dest`` with ``upper/``, ``meta.json`` and, for gVisor with memory,
        ``checkpoint/``; the source keeps its state (see the module docstring for how).

        A running gVisor source must have no established TCP connection (B3); a checkpoint that fails
        kills it, and then, as when its restore fails, its container, network and mount are removed and
        ``RuntimeFailure`` is raised (``state()`` is None; ``stop()`` removes the rest). On any failure
        ``dest`` is left empty. ``NotFoundError`` for an unknown sandbox, ``InvalidRequestError`` for a
        ``dest`` that is not an empty directory.
        """
        paths = self.sandbox_paths(sandbox_id)
        dest = check_empty_dir(dest)
        async with self._lock(sandbox_id), as_runtime_failure(f"snapshotting sandbox {sandbox_id}"):
            record = await self._settle(sandbox_id)
            if record is None:
                raise NotFoundError(f"no sandbox {sandbox_id} on this node")
            started = time.monotonic()
            try:
                memory, source = await self._snapshot_locked(record, paths, dest)
                new_meta(
                    kind=self.kind, memory=memory, platform=self.platform if self.kind is RuntimeKind.GVISOR else None,
                    binary=self.binary, version=self.probe().details.get("version"), agent_bundle=self.agent_bundle,
                    resources=record.resources, source_id=sandbox_id,
                    source_state="paused" if record.paused is not None else "running",
                ).write(dest)
                size = await asyncio.to_thread(directory_usage, dest)
            except BaseException:
                await asyncio.shield(asyncio.to_thread(clear_dir, dest))
                raise
            _log.info("snapshot of %s (memory=%s, %d bytes) took %.0f ms",
                      sandbox_id, memory, size, (time.monotonic() - started) * 1000)
            return SnapshotContents(memory=memory, runtime=self.kind, bytes=size, source=source)

    async def restore(self, spec: SandboxSpec, snapshot: Path) -> SandboxHandle:
        """Start sandbox ``spec.sandbox_id`` from a snapshot dir: a fresh netns and slot, an overlay of
        ``spec.layers`` under a copy of ``snapshot/upper``, and ``runsc restore`` of ``snapshot/checkpoint``
        or, without one, a normal start of the agent. The snapshot is only read, so any number of restores
        of it may run at once.

        Raises what :meth:`start` raises; ``RuntimeFailure`` (after removing everything it made) also for
        a snapshot without ``upper/`` or with a memory image runsc cannot restore, ``InvalidRequestError``
        for a memory image from another runtime, runsc platform or agent bundle.
        """
        self._check_spec(spec)
        source = open_snapshot(snapshot, kind=self.kind, platform=self.platform, agent_bundle=self.agent_bundle)
        async with self._lock(spec.sandbox_id), as_runtime_failure(f"restoring sandbox {spec.sandbox_id}"):
            return await self._create(spec, upper_from=source.upper, image=source.image)

    # ------------------------------------------------------------------ internals

    async def _snapshot_locked(self, record: SandboxRecord, paths: SandboxPaths,
                               dest: Path) -> tuple[bool, SandboxHandle | None]:
        """Write ``dest/upper`` (and ``dest/checkpoint``); return (memory image?, the source's handle)."""
        sid = record.sandbox_id
        if record.paused is not None:  # frozen, checkpointed or without processes: nothing can write
            memory = record.paused is PauseMode.MEMORY and not self._freezes(record.paused)
            if memory:
                await copy_tree(paths.checkpoint, dest / CHECKPOINT)
            await copy_tree(paths.upper, dest / UPPER, owner=to_neutral(record.uid_range))
            return memory, None
        if record.network is None:  # a failed checkpoint or restore left it without processes
            raise InvalidStateError(f"sandbox {sid} is not running")
        if self.kind is RuntimeKind.GVISOR:
            return True, await self._checkpoint_copy_restore(record, paths, dest)
        await self._freeze(sid)
        try:
            await copy_tree(paths.upper, dest / UPPER, owner=to_neutral(record.uid_range))
        finally:
            await self._thaw(sid)
        return False, self._handle(record, paths)

    async def _checkpoint_copy_restore(self, record: SandboxRecord, paths: SandboxPaths, dest: Path) -> SandboxHandle:
        """gVisor: checkpoint into ``dest/checkpoint`` (the sandbox stops), copy the upper dir, then restore
        the sandbox from that image into a fresh netns (its old one lost its address, B5)."""
        sid, net = record.sandbox_id, record.network
        assert net is not None
        image = dest / CHECKPOINT
        try:
            ck = await run_command(self._cli_of(sid).argv("checkpoint", f"--image-path={image}", sid),
                                   timeout=CHECKPOINT_TIMEOUT, output=paths.log)
        except RuntimeFailure as exc:
            alive = await self._cli_of(sid).state(sid) == "running"
            if not alive:
                await self._release(record, paths, paused=None)
            raise RuntimeFailure(f"checkpoint of sandbox {sid} failed ({'it still runs' if alive else 'it is gone'}): "
                                 f"{exc}") from exc
        # Stopped: free the container, cgroups and netns; the overlay stays mounted for the restore.
        record = replace(record, network=None)
        copy_error: BaseException | None = None
        try:
            await self._cli_of(sid).delete(sid)
            await self._remove_cgroups(sid)
            await self._network.destroy(net)
            await self._save(paths, record)
            try:
                took = await copy_tree(paths.upper, dest / UPPER)
            except BaseException as exc:  # a failure or a cancellation: restore the source, then raise it
                copy_error, took = exc, 0.0
            handle = await self._restore_in_place(record, paths, net.allow_internet, image, net.egress)
        except BaseException:
            await asyncio.shield(undo_step("sandbox", self._release, record, paths))
            raise
        _log.debug("snapshot %s: checkpoint %.1f ms, upper copy %.1f ms", sid, ck.duration * 1000, took * 1000)
        if copy_error is not None:
            raise copy_error
        return handle

"""The machinery under :class:`~warren.runtime.oci.runtime.OciRuntime`: its state, and the steps that
make, run and release one sandbox's host resources (netns, overlay, bundle, container, cgroups).

``OciRuntime`` subclasses :class:`OciBackendBase` and adds the Runtime protocol on top; nothing else
should use this class directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any

from warren import phases
from warren.errors import ConflictError, InvalidRequestError, NotFoundError, RuntimeFailure, UnavailableError
from warren.runtime.agent_bundle import AGENT_ARGV, agent_environment
from warren.runtime.base import AGENT_PORT, PauseMode, RuntimeKind, SandboxHandle, SandboxSpec
from warren.runtime.cgroups import CgroupHierarchies
from warren.runtime.disk import SandboxDisks
from warren.runtime.freezer import freezer_of
from warren.runtime.net.manager import NetworkManager
from warren.runtime.oci.cli import CLI_TIMEOUT, RuntimeCli
from warren.runtime.oci.command import run_command
from warren.runtime.oci.guestfiles import ensure_rootfs_tmp, write_boot_id
from warren.runtime.oci.layout import SandboxPaths, SandboxRecord, validate_sandbox_id, write_etc_files
from warren.runtime.oci.releases import PendingReleases, ReleaseStatistics
from warren.runtime.oci.snapshots import copy_tree
from warren.runtime.oci.spec import SANDBOX_OOM_SCORE_ADJ, ConfigInputs, build_config
from warren.runtime.oci.steps import load_record, read_pid, remove_tree, thread_to_end, undo_step
from warren.runtime.probe import agent_process_limits, pin_oom_score
from warren.runtime.rootfs import is_mountpoint, mount_overlay, unmount
from warren.runtime.userns import IdmappedLayers, RangeAllocator, UidRange, from_neutral
from warren.store import EgressPolicy

__all__ = ["RUNSC_HOST_TASKS", "RUN_TIMEOUT", "OciBackendBase"]

_log = logging.getLogger(__name__)

RUN_TIMEOUT = {RuntimeKind.RUNC: 30.0, RuntimeKind.GVISOR: 60.0}
"""Seconds for ``run -d`` / ``restore``: runc takes ~40 ms, runsc ~150 ms; the margin is for a loaded host."""

RUNSC_HOST_TASKS = 256
"""Extra host tasks allowed in a gVisor sandbox's pids cgroup: the sentry, gofer and Go runtime threads
(about 75 when idle). Guest processes cost about one host task each under ptrace."""


class OciBackendBase:
    """State and per-sandbox steps of one OCI backend (runc or runsc); see the module docstring."""

    def __init__(
        self,
        kind: RuntimeKind,
        binary: Path,
        state_dir: Path,
        agent_bundle: Path,
        network: NetworkManager,
        *,
        cgroup_parent: str = "warren",
        platform: str = "ptrace",
        cgroups: CgroupHierarchies | None = None,
        hardened: bool = True,
        uid_ranges: RangeAllocator | None = None,
        disks: SandboxDisks | None = None,
    ) -> None:
        self.kind = kind
        self.binary = binary
        self.state_dir = state_dir.absolute()
        self.agent_bundle = agent_bundle.absolute()
        self.cgroup_parent = cgroup_parent.strip("/")
        self.platform = platform
        self._network = network
        self._cgroups = cgroups or CgroupHierarchies.detect()
        self._root = self.state_dir / "runtime" / ("runc" if kind is RuntimeKind.RUNC else "runsc")
        self._cli = RuntimeCli(kind, binary, self._root, platform)
        self._sandboxes = self.state_dir / "sandboxes"
        self._probe: dict[str, Any] | None = None
        self._records: dict[str, SandboxRecord] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._oom_score_adj, self._nofile = agent_process_limits()
        self.hardened = hardened
        self._uid_ranges = uid_ranges if kind is RuntimeKind.RUNC else None
        """Per-sandbox user namespaces (runc only; gVisor's sentry is its own user-space kernel)."""
        self._userns_reason = "" if self._uid_ranges is not None else "not asked for"
        self.disks = disks if disks is not None else SandboxDisks(self.state_dir)
        """Per-sandbox disk size (``sandboxes/<id>/disk``, see :mod:`warren.runtime.disk`); may be shared."""
        mount = shutil.which("mount") if kind is RuntimeKind.RUNC else None
        self._mount_binary = Path(mount) if mount else None
        """runc binds each sandbox's boot id with mount(8) as a hook; None: runsc's spec mount does it."""
        self._releases = PendingReleases()
        """Releases of checkpointed sandboxes still running after their pause answered (see :meth:`_settle`)."""

    async def aclose(self) -> None:
        """Wait for the releases still running (node shutdown, after the last pause); cancelled, cancel
        them: their records name what is left, and the next start's first operation on each finishes it."""
        await self._releases.aclose()

    def release_statistics(self) -> ReleaseStatistics:
        """How many releases of paused sandboxes still run, and how many operations wait for one."""
        return self._releases.statistics()

    def _cli_for(self, record: SandboxRecord | None) -> RuntimeCli:
        """The CLI of the runtime a sandbox was made with (seed 003: it never changes under a sandbox)."""
        if record is None or record.binary is None or Path(record.binary) == self.binary:
            return self._cli
        return RuntimeCli(self.kind, Path(record.binary), self._root, self.platform)

    def _cli_of(self, sandbox_id: str) -> RuntimeCli:
        return self._cli_for(self._records.get(sandbox_id))

    def cli_argv(self, *args: str | Path) -> list[str | Path]:
        """The runtime CLI with this backend's global flags (``--root`` ...), e.g. for ``exec`` or
        ``checkpoint``: ``await run_command(rt.cli_argv("exec", sid, "true"), timeout=10)``."""
        return self._cli.argv(*args)

    def sandbox_paths(self, sandbox_id: str) -> SandboxPaths:
        validate_sandbox_id(sandbox_id)
        return SandboxPaths(self._sandboxes / sandbox_id)

    def _check_spec(self, spec: SandboxSpec) -> None:
        validate_sandbox_id(spec.sandbox_id)
        if spec.runtime is not self.kind:
            raise InvalidRequestError(f"this backend runs {self.kind} sandboxes, not {spec.runtime}")
        if self._probe is not None and not self._probe.get("available"):
            raise UnavailableError(str(self._probe.get("reason") or f"{self.kind} is not available"))

    async def _create(self, spec: SandboxSpec, *, upper_from: Path | None, image: Path | None) -> SandboxHandle:
        """A new sandbox dir (upper empty or a copy of ``upper_from``) and :meth:`_launch`; all or nothing."""
        paths = self.sandbox_paths(spec.sandbox_id)
        async with contextlib.AsyncExitStack() as undo:
            try:
                paths.root.mkdir()
            except FileExistsError as exc:
                raise ConflictError(f"sandbox {spec.sandbox_id} already exists on this node") from exc
            undo.push_async_callback(undo_step, "files", self._remove_dir, paths.root)
            rng = self._allocate_range()
            if rng is not None:
                undo.callback(self._release_range, rng)
                os.chown(paths.root, rng.host, rng.host)
            paths.root.chmod(0o700)
            undo.push_async_callback(undo_step, "disk", self._release_disk, paths.root)
            await self._make_disk(paths.root, spec.resources.disk_mb)  # upper/ and work/ live on it
            if upper_from is None:
                paths.upper.mkdir()
            else:  # snapshots hold 0-based owners; shift them into this sandbox's range
                took = await copy_tree(upper_from, paths.upper, owner=from_neutral(rng))
                _log.debug("restore %s: upper copied in %.1f ms", spec.sandbox_id, took * 1000)
            for d in (paths.work, paths.rootfs):
                d.mkdir(parents=True)
            if rng is not None:
                for d in (paths.upper, paths.work, paths.bundle, paths.rootfs):
                    os.chown(d, rng.host, rng.host)
            handle = await self._launch(spec, paths, undo, restore=image, uid_range=rng)
            undo.pop_all()
        return handle

    async def _restore_in_place(self, record: SandboxRecord, paths: SandboxPaths, allow_internet: bool,
                                image: Path, egress: EgressPolicy) -> SandboxHandle:
        """Restore a checkpointed sandbox from ``image`` with its own bundle into a new netns (same name,
        so ``config.json`` stays valid; new slot, so the address and ``/etc/hosts`` change)."""
        sid = record.sandbox_id
        async with contextlib.AsyncExitStack() as undo:
            net = await self._network.create(sid, allow_internet=allow_internet, egress=egress)
            undo.push_async_callback(undo_step, "network", self._network.destroy, net)
            record = replace(record, network=net, paused=None)
            await asyncio.to_thread(record.save, paths.record)
            await asyncio.to_thread(write_etc_files, paths.etc, sid, net.guest_ip, self._network.dns_servers,
                                    record.uid_range)
            handle = await self._run(paths, record, undo, restore=image)
            undo.pop_all()
        return handle

    async def update_egress(self, sandbox_id: str, egress: EgressPolicy) -> None:
        """Replace the egress policy of a sandbox that has a network (running or frozen) and record it;
        one without a network gets it from the spec it resumes with."""
        paths = self.sandbox_paths(sandbox_id)
        async with self._lock(sandbox_id):
            await self._releases.wait(sandbox_id)
            record = self._record(sandbox_id)
            if record is None:
                raise NotFoundError(f"no sandbox {sandbox_id} on this node")
            if record.network is not None and not self._release_pending(record):
                net = await self._network.set_egress(record.network, egress)
                await self._save(paths, replace(record, network=net))

    def egress_ca(self) -> bytes:
        return self._network.ca_pem

    def _handle(self, record: SandboxRecord, paths: SandboxPaths) -> SandboxHandle:
        assert record.network is not None
        return SandboxHandle(record.sandbox_id, self.kind, record.network.guest_ip, AGENT_PORT,
                             read_pid(paths.pid_file))

    def _freezes(self, mode: PauseMode) -> bool:
        """Whether ``mode`` keeps the container (runc's freezer) rather than removing it."""
        return mode is PauseMode.MEMORY and self.kind is RuntimeKind.RUNC

    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        lock = self._locks.get(sandbox_id)
        if lock is None:
            lock = self._locks[sandbox_id] = asyncio.Lock()
        return lock

    def _cgroup_rel(self, sandbox_id: str) -> str:
        return f"{self.cgroup_parent}/{sandbox_id}"

    async def _freeze(self, sandbox_id: str) -> None:
        """``runc pause``, done as runc does it but without starting runc (:mod:`warren.runtime.freezer`)."""
        await self._set_frozen(sandbox_id, True)

    async def _thaw(self, sandbox_id: str) -> None:
        """``runc resume`` without starting runc."""
        await self._set_frozen(sandbox_id, False)

    async def _set_frozen(self, sandbox_id: str, frozen: bool) -> None:
        freezer = await asyncio.to_thread(freezer_of, self._cgroups, self._cgroup_rel(sandbox_id))
        if freezer is None:  # no freezer directory found: the CLI, which finds its own
            verb = "pause" if frozen else "resume"
            await run_command(self._cli_of(sandbox_id).argv(verb, sandbox_id), timeout=CLI_TIMEOUT)
            return
        try:
            await asyncio.to_thread(freezer.freeze if frozen else freezer.thaw)
        except OSError as exc:
            raise RuntimeFailure(f"cannot {'freeze' if frozen else 'thaw'} sandbox {sandbox_id}: {exc}") from exc

    def _record(self, sandbox_id: str) -> SandboxRecord | None:
        """This backend's record of the sandbox (memory, else disk); None if unknown or the other kind's."""
        record = self._records.get(sandbox_id) or load_record(self.sandbox_paths(sandbox_id))
        return record if record is not None and record.kind is self.kind else None

    async def _save(self, paths: SandboxPaths, record: SandboxRecord) -> None:
        """Write the record (fsync'd, in a worker thread) and keep it in memory."""
        await asyncio.to_thread(record.save, paths.record)
        self._records[record.sandbox_id] = record

    def _release_pending(self, record: SandboxRecord) -> bool:
        """Whether the record names a release not yet done: checkpointed (paused, not frozen) while it
        still has a network. Set by a gVisor memory pause, cleared by :meth:`_release`."""
        return record.paused is not None and not self._freezes(record.paused) and record.network is not None

    async def _settle(self, sandbox_id: str) -> SandboxRecord | None:
        """Under the sandbox lock, before anything else touches the sandbox: wait for its pending release
        and, when its record still names one (that release failed, or the node stopped during it), run
        it here (raising ``RuntimeFailure`` if it fails again). Returns the record, as :meth:`_record`."""
        await self._releases.wait(sandbox_id)
        record = self._record(sandbox_id)
        if record is not None and record.paused is not None and self._release_pending(record):
            await self._release(record, self.sandbox_paths(sandbox_id), paused=record.paused)
            record = self._record(sandbox_id)
        return record

    async def _launch(self, spec: SandboxSpec, paths: SandboxPaths, undo: contextlib.AsyncExitStack,
                      *, restore: Path | None, uid_range: UidRange | None) -> SandboxHandle:
        """Network, overlay (unless mounted), bundle, then ``run`` or ``restore``; undo steps go on ``undo``."""
        sid = spec.sandbox_id
        with phases.phase("launch.network"):
            net = await self._network.create(sid, allow_internet=spec.allow_internet, egress=spec.egress)
        undo.push_async_callback(undo_step, "network", self._network.destroy, net)
        binary = str(spec.runtime_binary) if spec.runtime_binary else None
        record = SandboxRecord(sid, self.kind, spec.resources, net, binary=binary, uid_range=uid_range)
        await asyncio.to_thread(record.save, paths.record)
        if not await asyncio.to_thread(is_mountpoint, paths.rootfs):
            layers = [Path(p) for p in spec.layers]
            if not layers:
                paths.empty_lower.mkdir(exist_ok=True)
                layers = [paths.empty_lower]
            # The undo goes first: a cancellation while the worker thread mounts must still unmount.
            undo.push_async_callback(undo_step, "overlay", self._unmount, paths.rootfs)
            with phases.phase("launch.mount"):
                await asyncio.to_thread(self._mount_rootfs, layers, paths, uid_range)
        # A memory image continues the same boot; anything else boots afresh (a new boot id).
        await asyncio.to_thread(self._write_bundle, spec, paths, record, restore is None)
        with phases.phase("launch.run"):
            return await self._run(paths, record, undo, restore=restore)

    async def _run(self, paths: SandboxPaths, record: SandboxRecord, undo: contextlib.AsyncExitStack,
                   *, restore: Path | None) -> SandboxHandle:
        """``run`` or ``restore`` the container of an existing bundle; undo steps go on ``undo``."""
        sid = record.sandbox_id
        undo.push_async_callback(undo_step, "cgroups", self._remove_cgroups, sid)
        cli = self._cli_for(record)
        undo.push_async_callback(undo_step, "container", cli.delete, sid)
        bundle_args: list[str | Path] = ["--bundle", paths.bundle, "--pid-file", paths.pid_file, sid]
        if restore is not None:
            argv = cli.argv("restore", "--detach", f"--image-path={restore}", *bundle_args)
        else:
            argv = cli.argv("run", "-d" if self.kind is RuntimeKind.RUNC else "--detach", *bundle_args)
        result = await run_command(argv, timeout=RUN_TIMEOUT[self.kind], output=paths.log)
        _log.debug("%s %s: %.1f ms", "restore" if restore else "run", sid, result.duration * 1000)
        if self.hardened:
            pin_oom_score(read_pid(paths.pid_file), SANDBOX_OOM_SCORE_ADJ)
        self._records[sid] = record
        return self._handle(record, paths)

    @staticmethod
    def _mount_rootfs(layers: list[Path], paths: SandboxPaths, uid_range: UidRange | None) -> None:
        """The overlay at ``paths.rootfs``; in a user namespace its layers are seen through idmapped
        views of ``uid_range`` (detached mounts that the overlay alone keeps alive)."""
        if uid_range is None:
            mount_overlay(layers, paths.upper, paths.work, paths.rootfs)
            return
        with IdmappedLayers(layers, uid_range) as views:
            mount_overlay(views.paths, paths.upper, paths.work, paths.rootfs)

    def _allocate_range(self) -> UidRange | None:
        return self._uid_ranges.allocate() if self._uid_ranges is not None else None

    def _release_range(self, rng: UidRange | None) -> None:
        if self._uid_ranges is not None:
            self._uid_ranges.release(rng)

    def userns_status(self) -> dict[str, Any]:
        """How this backend isolates sandbox root, for ``/health``."""
        if self._uid_ranges is None:
            return {"mode": "off", "reason": self._userns_reason}
        return {"mode": "per-sandbox", "range_size": 65536, "base": self._uid_ranges.base,
                "in_use": self._uid_ranges.in_use()}

    def _write_bundle(self, spec: SandboxSpec, paths: SandboxPaths, record: SandboxRecord, new_boot: bool) -> None:
        """``/etc`` files, the boot id, the rootfs's ``/tmp`` and ``config.json`` (blocking file work: run it
        in a worker thread, while nothing runs in the sandbox)."""
        write_boot_id(paths.boot_id, record.uid_range, fresh=new_boot)
        tmp = ensure_rootfs_tmp(paths.rootfs, record.uid_range)
        config = build_config(self._config_inputs(spec, paths, record, tmp))
        (paths.bundle / "config.json").write_text(json.dumps(config, indent=1))

    def _config_inputs(self, spec: SandboxSpec, paths: SandboxPaths, record: SandboxRecord,
                       rootfs_tmp: Path | None) -> ConfigInputs:
        assert record.network is not None
        resources = spec.resources
        if self.kind is RuntimeKind.GVISOR:
            # The host pids cgroup counts the sentry's threads too; exceeding it stops the whole sandbox.
            resources = replace(resources, pids_max=resources.pids_max + RUNSC_HOST_TASKS)
        etc = write_etc_files(paths.etc, spec.sandbox_id, record.network.guest_ip, self._network.dns_servers,
                              record.uid_range)
        return ConfigInputs(
            hostname=spec.sandbox_id,
            rootfs=paths.rootfs,
            netns_path=record.network.netns_path,
            agent_bundle=self.agent_bundle,
            etc_files=etc,
            cgroups_path=f"/{self._cgroup_rel(spec.sandbox_id)}",
            resources=resources,
            args=AGENT_ARGV,
            env={**agent_environment(), **spec.agent_env},
            nofile=self._nofile,
            oom_score_adj=SANDBOX_OOM_SCORE_ADJ if self.hardened else self._oom_score_adj,
            hardened=self.hardened,
            uid_range=record.uid_range,
            tmp_dir=rootfs_tmp if self.kind is RuntimeKind.GVISOR else None,
            tmp_tmpfs=spec.tmp_tmpfs,
            boot_id=paths.boot_id if self.kind is RuntimeKind.GVISOR or self._mount_binary else None,
            mount_binary=self._mount_binary,
        )

    async def _release(self, record: SandboxRecord, paths: SandboxPaths, *, paused: PauseMode | None = None) -> None:
        """End the container and free its network and mount; keep the sandbox dir (upper, checkpoint)."""
        await self._cli_for(record).delete(record.sandbox_id)
        await self._unmount(paths.rootfs)
        await self._remove_cgroups(record.sandbox_id)
        if record.network is not None:
            await self._network.destroy(record.network)
        await self._save(paths, replace(record, network=None, paused=paused))

    async def _unmount(self, target: Path) -> None:
        await thread_to_end(unmount, target)

    async def _remove_cgroups(self, sandbox_id: str) -> None:
        left = await asyncio.to_thread(self._cgroups.remove, self._cgroup_rel(sandbox_id))
        if left:
            raise RuntimeFailure(f"cgroups still in use: {', '.join(map(str, left))}")

    async def _make_disk(self, root: Path, size_mb: int) -> None:
        """``disks.create`` in a thread; a cancellation waits for the thread so that the undo sees its mount."""
        await thread_to_end(self.disks.create, root, size_mb)

    async def _release_disk(self, root: Path) -> None:
        await asyncio.to_thread(self.disks.release, root)

    async def _remove_dir(self, root: Path) -> None:
        await asyncio.to_thread(remove_tree, root)

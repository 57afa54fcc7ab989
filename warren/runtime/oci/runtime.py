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
failed checkpoint destroys the sandbox, guest-agent-notes B3). ``PauseMode.FILESYSTEM`` ends every
process and keeps the upper dir; resume starts the agent afresh. The on-disk layout is described in
:mod:`warren.runtime.oci.layout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from warren.errors import (
    ConflictError,
    InvalidRequestError,
    InvalidStateError,
    NotFoundError,
    RuntimeFailure,
    UnavailableError,
)
from warren.runtime.agent_bundle import AGENT_ARGV, agent_environment
from warren.runtime.base import AGENT_PORT, PauseMode, RuntimeKind, SandboxHandle, SandboxSpec, SandboxStats
from warren.runtime.cgroups import CgroupHierarchies
from warren.runtime.net.manager import NetworkManager
from warren.runtime.net.netns import delete_netns
from warren.runtime.oci.cli import CLI_TIMEOUT, RuntimeCli
from warren.runtime.oci.command import run_command
from warren.runtime.oci.layout import SandboxPaths, SandboxRecord, validate_sandbox_id, write_etc_files
from warren.runtime.oci.spec import ConfigInputs, build_config
from warren.runtime.oci.steps import as_runtime_failure, load_record, read_pid, remove_tree, undo_step
from warren.runtime.probe import agent_process_limits, probe_runc, probe_runsc
from warren.runtime.rootfs import directory_usage, is_mountpoint, mount_overlay, unmount

__all__ = ["OciRuntime"]

_log = logging.getLogger(__name__)

RUN_TIMEOUT = {RuntimeKind.RUNC: 30.0, RuntimeKind.GVISOR: 60.0}
"""Seconds for ``run -d`` / ``restore``: runc takes ~40 ms, runsc ~150 ms; the margin is for a loaded host."""
CHECKPOINT_TIMEOUT = 120.0
"""gVisor writes the whole sandbox memory; ~0.1 s for an idle agent, longer for GBs of guest memory."""

RUNSC_HOST_TASKS = 256
"""Extra host tasks allowed in a gVisor sandbox's pids cgroup: the sentry, gofer and Go runtime threads
(about 75 when idle). Guest processes cost about one host task each under ptrace."""

MIB = 1024 * 1024


class OciRuntime:
    """Sandboxes under runc (``kind=RUNC``) or runsc (``kind=GVISOR``); see the module docstring."""

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

    # ------------------------------------------------------------------ the backend itself

    async def setup(self) -> Mapping[str, Any]:
        """Create the state dirs and run the startup probe; returns (and caches) the probe result."""
        for d in (self._root, self._sandboxes):
            d.mkdir(parents=True, exist_ok=True)
        if self.kind is RuntimeKind.RUNC:
            result = await probe_runc(self.binary)
        else:
            result = await probe_runsc(
                self.binary, work_dir=self.state_dir / "probe", platform=self.platform,
                netns_prefix=self._network.config.netns_prefix, agent_bundle=self.agent_bundle,
            )
        result["oom_protected_agent"] = self._oom_score_adj is not None
        self._probe = result
        return result

    def set_unavailable(self, reason: str) -> None:
        """Record a failed probe without running one (e.g. the binary or networking is missing)."""
        self._probe = {"available": False, "reason": reason, "kind": str(self.kind), "binary": str(self.binary)}

    def probe(self) -> Mapping[str, Any]:
        """The result of :meth:`setup`'s probe, or "not probed" before it ran."""
        if self._probe is None:
            return {"available": False, "reason": "not probed yet", "kind": str(self.kind)}
        return self._probe

    async def recover(self) -> list[str]:
        """Reload the records of sandboxes left on disk by a previous process; return their ids.

        Their pool slots are reserved again. The caller decides to keep (state()) or stop() each one.
        """
        ids = []
        for child in sorted(self._sandboxes.iterdir()) if self._sandboxes.is_dir() else []:
            record = load_record(SandboxPaths(child))
            if record is None or record.kind is not self.kind:
                continue
            if record.network is not None:
                self._network.adopt(record.network)
            self._records[record.sandbox_id] = record
            ids.append(record.sandbox_id)
        return ids

    def cli_argv(self, *args: str | Path) -> list[str | Path]:
        """The runtime CLI with this backend's global flags (``--root`` ...), e.g. for ``exec`` or
        ``checkpoint``: ``await run_command(rt.cli_argv("exec", sid, "true"), timeout=10)``."""
        return self._cli.argv(*args)

    def sandbox_paths(self, sandbox_id: str) -> SandboxPaths:
        validate_sandbox_id(sandbox_id)
        return SandboxPaths(self._sandboxes / sandbox_id)

    # ------------------------------------------------------------------ Runtime protocol

    async def start(self, spec: SandboxSpec) -> SandboxHandle:
        """Create the sandbox's netns, overlay, bundle and container; the agent is starting on return.

        Raises ``InvalidRequestError`` (bad id / wrong kind), ``UnavailableError`` (the probe failed),
        ``ConflictError`` (the id exists), or ``RuntimeFailure`` after removing everything it made.
        """
        validate_sandbox_id(spec.sandbox_id)
        if spec.runtime is not self.kind:
            raise InvalidRequestError(f"this backend runs {self.kind} sandboxes, not {spec.runtime}")
        if self._probe is not None and not self._probe.get("available"):
            raise UnavailableError(str(self._probe.get("reason") or f"{self.kind} is not available"))
        paths = self.sandbox_paths(spec.sandbox_id)
        async with self._lock(spec.sandbox_id), as_runtime_failure(f"starting sandbox {spec.sandbox_id}"):
            async with contextlib.AsyncExitStack() as undo:
                try:
                    paths.root.mkdir()
                except FileExistsError as exc:
                    raise ConflictError(f"sandbox {spec.sandbox_id} already exists on this node") from exc
                undo.push_async_callback(undo_step, "files", self._remove_dir, paths.root)
                for d in (paths.upper, paths.work, paths.rootfs):
                    d.mkdir(parents=True)
                handle = await self._launch(spec, paths, undo, restore=None)
                undo.pop_all()
            return handle

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
            record = self._records.get(sandbox_id) or load_record(paths)
            if record is not None and record.kind is not self.kind:
                return  # the other backend's sandbox (they share the sandboxes dir): not ours to touch
            errors: list[str] = []

            async def step(what: str, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
                try:
                    await fn(*args)
                except Exception as exc:
                    errors.append(f"{what}: {exc}")

            await step("container", self._cli.delete, sandbox_id)
            await step("overlay", self._unmount, paths.rootfs)
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

    async def state(self, sandbox_id: str) -> str | None:
        """``running``, ``paused`` or ``stopped``; None when neither warren nor the runtime knows the id."""
        try:
            validate_sandbox_id(sandbox_id)
        except InvalidRequestError:
            return None
        record = self._record(sandbox_id)
        if record is not None and record.paused is not None and not self._freezes(record.paused):
            return "paused"  # no container exists while checkpointed or paused without processes
        return await self._cli.state(sandbox_id)

    async def stats(self, sandbox_id: str) -> SandboxStats:
        """CPU, memory (from the cgroup) and disk (the upper dir) of a sandbox this backend started."""
        paths = self.sandbox_paths(sandbox_id)
        record = self._record(sandbox_id)
        if record is None:
            raise NotFoundError(f"no sandbox {sandbox_id} on this node")
        res = record.resources
        usage = await asyncio.to_thread(self._cgroups.usage, self._cgroup_rel(sandbox_id))
        disk = await asyncio.to_thread(directory_usage, paths.upper)
        return SandboxStats(
            cpu_count=res.cpu_count,
            cpu_usage_ns=usage.cpu_usage_ns if usage else 0,
            memory_used=usage.memory_usage if usage else 0,
            memory_total=(usage.memory_limit if usage and usage.memory_limit else res.memory_mb * MIB),
            memory_cache=usage.memory_cache if usage else 0,
            disk_used=disk,
            disk_total=res.disk_mb * MIB,
        )

    async def pause(self, sandbox_id: str, mode: PauseMode) -> None:
        """Freeze (runc MEMORY), checkpoint (gVisor MEMORY) or end the processes (FILESYSTEM).

        gVisor refuses to checkpoint while any TCP connection is established (B3): close the proxy's
        and the node's connections to the agent first. A failed checkpoint kills the sandbox; its
        network and container are then removed and ``RuntimeFailure`` is raised (``state()`` is None).
        """
        paths = self.sandbox_paths(sandbox_id)
        async with self._lock(sandbox_id), as_runtime_failure(f"pausing sandbox {sandbox_id}"):
            record = self._record(sandbox_id)
            if record is None:
                raise NotFoundError(f"no sandbox {sandbox_id} on this node")
            if record.paused is not None:
                raise InvalidStateError(f"sandbox {sandbox_id} is already paused")
            if self._freezes(mode):
                await run_command(self.cli_argv("pause", sandbox_id), timeout=CLI_TIMEOUT)
            elif mode is PauseMode.MEMORY:
                await asyncio.to_thread(remove_tree, paths.checkpoint)
                try:
                    await run_command(self.cli_argv("checkpoint", f"--image-path={paths.checkpoint}", sandbox_id),
                                      timeout=CHECKPOINT_TIMEOUT, output=paths.log)
                except RuntimeFailure:
                    if await self.state(sandbox_id) != "running":
                        await self._release(record, paths, paused=None)
                    raise
                await self._release(record, paths, paused=mode)
                return
            else:
                await self._release(record, paths, paused=mode)
                return
            self._save(paths, replace(record, paused=mode))

    async def resume(self, spec: SandboxSpec, mode: PauseMode) -> SandboxHandle:
        """Undo :meth:`pause`. After a checkpoint or a FILESYSTEM pause the sandbox gets a fresh netns,
        so ``handle.address`` may differ. On failure the sandbox stays paused and can be resumed again."""
        sid = spec.sandbox_id
        paths = self.sandbox_paths(sid)
        async with self._lock(sid), as_runtime_failure(f"resuming sandbox {sid}"):
            record = self._record(sid)
            if record is None:
                raise NotFoundError(f"no sandbox {sid} on this node")
            if record.paused is None:
                raise InvalidStateError(f"sandbox {sid} is not paused")
            if record.paused is not mode:
                _log.warning("resuming %s as %s, the mode it was paused with (asked: %s)", sid, record.paused, mode)
            if self._freezes(record.paused) and record.network is not None:
                await run_command(self.cli_argv("resume", sid), timeout=CLI_TIMEOUT)
                self._save(paths, replace(record, paused=None))
                return SandboxHandle(sid, self.kind, record.network.guest_ip, AGENT_PORT, read_pid(paths.pid_file))
            restore = paths.checkpoint if record.paused is PauseMode.MEMORY else None
            async with contextlib.AsyncExitStack() as undo:
                undo.push_async_callback(undo_step, "record", self._save_async, paths, record)
                handle = await self._launch(spec, paths, undo, restore=restore)
                undo.pop_all()
            if restore is not None:
                await asyncio.to_thread(remove_tree, restore)
            return handle

    # ------------------------------------------------------------------ internals

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

    def _record(self, sandbox_id: str) -> SandboxRecord | None:
        """This backend's record of the sandbox (memory, else disk); None if unknown or the other kind's."""
        record = self._records.get(sandbox_id) or load_record(self.sandbox_paths(sandbox_id))
        return record if record is not None and record.kind is self.kind else None

    def _save(self, paths: SandboxPaths, record: SandboxRecord) -> None:
        record.save(paths.record)
        self._records[record.sandbox_id] = record

    async def _save_async(self, paths: SandboxPaths, record: SandboxRecord) -> None:
        self._save(paths, record)

    async def _launch(self, spec: SandboxSpec, paths: SandboxPaths, undo: contextlib.AsyncExitStack,
                      *, restore: Path | None) -> SandboxHandle:
        """Network, overlay (unless mounted), bundle, then ``run`` or ``restore``; undo steps go on ``undo``."""
        sid = spec.sandbox_id
        net = await self._network.create(sid, allow_internet=spec.allow_internet)
        undo.push_async_callback(undo_step, "network", self._network.destroy, net)
        record = SandboxRecord(sid, self.kind, spec.resources, net)
        record.save(paths.record)
        if not is_mountpoint(paths.rootfs):
            layers = [Path(p) for p in spec.layers]
            if not layers:
                paths.empty_lower.mkdir(exist_ok=True)
                layers = [paths.empty_lower]
            mount_overlay(layers, paths.upper, paths.work, paths.rootfs)
            undo.push_async_callback(undo_step, "overlay", self._unmount, paths.rootfs)
        config = build_config(self._config_inputs(spec, paths, record))
        (paths.bundle / "config.json").write_text(json.dumps(config, indent=1))
        undo.push_async_callback(undo_step, "cgroups", self._remove_cgroups, sid)
        undo.push_async_callback(undo_step, "container", self._cli.delete, sid)
        bundle_args: list[str | Path] = ["--bundle", paths.bundle, "--pid-file", paths.pid_file, sid]
        if restore is not None:
            argv = self.cli_argv("restore", "--detach", f"--image-path={restore}", *bundle_args)
        else:
            argv = self.cli_argv("run", "-d" if self.kind is RuntimeKind.RUNC else "--detach", *bundle_args)
        await run_command(argv, timeout=RUN_TIMEOUT[self.kind], output=paths.log)
        self._records[sid] = record
        return SandboxHandle(sid, self.kind, net.guest_ip, AGENT_PORT, read_pid(paths.pid_file))

    def _config_inputs(self, spec: SandboxSpec, paths: SandboxPaths, record: SandboxRecord) -> ConfigInputs:
        assert record.network is not None
        resources = spec.resources
        if self.kind is RuntimeKind.GVISOR:
            # The host pids cgroup counts the sentry's threads too; exceeding it stops the whole sandbox.
            resources = replace(resources, pids_max=resources.pids_max + RUNSC_HOST_TASKS)
        etc = write_etc_files(paths.etc, spec.sandbox_id, record.network.guest_ip, self._network.dns_servers)
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
            oom_score_adj=self._oom_score_adj,
        )

    async def _release(self, record: SandboxRecord, paths: SandboxPaths, *, paused: PauseMode | None) -> None:
        """End the container and free its network and mount; keep the sandbox dir (upper, checkpoint)."""
        await self._cli.delete(record.sandbox_id)
        await self._unmount(paths.rootfs)
        await self._remove_cgroups(record.sandbox_id)
        if record.network is not None:
            await self._network.destroy(record.network)
        self._save(paths, replace(record, network=None, paused=paused))

    async def _unmount(self, target: Path) -> None:
        unmount(target)

    async def _remove_cgroups(self, sandbox_id: str) -> None:
        left = await asyncio.to_thread(self._cgroups.remove, self._cgroup_rel(sandbox_id))
        if left:
            raise RuntimeFailure(f"cgroups still in use: {', '.join(map(str, left))}")

    async def _remove_dir(self, root: Path) -> None:
        await asyncio.to_thread(remove_tree, root)

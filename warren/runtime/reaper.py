"""Start-up reaping of orphaned sandboxes: what this node made but its store no longer knows.

After a SIGKILL or OOM kill of the server, its runc/runsc sandboxes keep running. The node re-adopts
every sandbox its store knows (``SandboxManager.recover``); :func:`reap_orphans` then stops and removes
the rest. It never decides by binary name or by pid alone (seed 001's faults): ownership comes from
markers only this node has.

Ownership. Two kinds of marker:

* *Private* to this node (the instance lock gives one server per state dir): the runtimes' ``--root``
  dirs (``runc --root R list`` / ``runsc --root=R list``, and the container entries in R), and the
  sandbox dirs ``state_dir/sandboxes/<id>`` (a sandbox's dir is made before any of its host resources
  and removed after all of them, so every resource a sandbox ever had is named by a dir or a root).
* *Shared names*: the cgroup parent, the netns prefix and the veth prefix. These are names, not proof:
  two nodes on one host with default settings (a bench node next to an e2e node) share ``warren`` and
  ``wrn-``. So a cgroup ``<parent>/<id>``, a netns ``<prefix><id>`` or a veth is removed only for an id
  the private markers name, or whose cgroup holds a process that names this state dir (a runsc
  sandbox/gofer command line, or a container whose overlay upper dir is under it). Anything else under
  the shared names is reported as ``unattributed`` and left alone.

An orphan is an id named that way and not in ``known``. Its stop, for all orphans at once:

1. thaw its freezer cgroup (a frozen task would not act on SIGTERM or even SIGKILL under v1);
2. record the identity (pid, start time, cgroup) of every pid in its cgroup, in every hierarchy (for
   gVisor these are the runsc sandbox and gofer and the ptrace stubs: the whole sandbox is there);
3. :func:`~warren.runtime.processes.terminate_group`: SIGTERM, up to ``grace_s``, re-check each
   identity, SIGKILL only the ones still the same; then sweep processes forked meanwhile.

Then, per orphan: ``delete --force`` in each of our roots that has it, unmount the overlay (and any
mount under its dir), delete the veth whose peer is in its netns and the netns, free its address slot
and nft block, rmdir its cgroups in every hierarchy, and remove its dir. A step that fails leaves the
dir in place, so the next start retries; the failure is in ``ReapReport.failed``.

Process groups are not used: a runsc gofer stays in the process group of whoever ran ``runsc run``
(the old server), which a new server may share.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warren.errors import InvalidRequestError, RuntimeFailure
from warren.mountinfo import read_mounts
from warren.runtime.base import RuntimeKind
from warren.runtime.cgroups import CgroupHierarchies
from warren.runtime.net.manager import NetworkManager, SandboxNetwork
from warren.runtime.net.netns import delete_netns, link_exists, list_netns, netns_exists
from warren.runtime.oci.cli import CLI_TIMEOUT
from warren.runtime.oci.command import RuntimeCommandError, run_command
from warren.runtime.oci.layout import SandboxPaths, SandboxRecord, validate_sandbox_id
from warren.runtime.oci.runtime import OciRuntime
from warren.runtime.oci.steps import load_record, remove_tree
from warren.runtime.processes import PROC, ProcessIdentity, read_identity, terminate_group
from warren.runtime.rootfs import mounts_under, unmount
from warren.trees import walk

__all__ = ["ReapReport", "reap_orphans", "runtime_root"]

_log = logging.getLogger(__name__)

SWEEP_ROUNDS = 5
"""Rounds of "list the cgroup, kill what is new" after the SIGTERM/SIGKILL pass (forks during the grace)."""

IP_TIMEOUT = 15.0


@dataclass(frozen=True)
class ReapReport:
    """What :func:`reap_orphans` found and removed, per kind of resource."""

    orphans: tuple[str, ...] = ()
    """Sandbox ids owned by this node and unknown to the store."""
    processes: tuple[int, ...] = ()
    """Pids that got SIGTERM and/or SIGKILL and are gone."""
    containers: tuple[str, ...] = ()
    """``<runtime>:<id>`` deleted from one of our runtime roots."""
    mounts: tuple[str, ...] = ()
    netns: tuple[str, ...] = ()
    veths: tuple[str, ...] = ()
    cgroups: tuple[str, ...] = ()
    """Cgroup directories removed (by ``delete --force`` or by us), one per hierarchy."""
    dirs: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)
    """Orphan id -> what could not be removed; its dir is kept so the next start tries again."""
    unattributed: tuple[str, ...] = ()
    """Cgroups and netns under our shared names that nothing ties to this node: left alone."""


@dataclass
class _Acc:
    """Mutable collector behind the frozen report."""

    orphans: list[str] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)
    veths: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unattributed: list[str] = field(default_factory=list)

    def freeze(self) -> ReapReport:
        return ReapReport(
            orphans=tuple(self.orphans), processes=tuple(sorted(set(self.processes))),
            containers=tuple(self.containers), mounts=tuple(self.mounts), netns=tuple(self.netns),
            veths=tuple(self.veths), cgroups=tuple(self.cgroups), dirs=tuple(self.dirs),
            failed=dict(self.failed), unattributed=tuple(self.unattributed),
        )  # fmt: skip


# ---------------------------------------------------------------------------------------- discovery


def runtime_root(backend: OciRuntime) -> Path | None:
    """The ``--root`` this backend passes to its runtime (its private state dir)."""
    argv = [str(a) for a in backend.cli_argv()]
    for i, arg in enumerate(argv):
        if arg == "--root" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if arg.startswith("--root="):
            return Path(arg.removeprefix("--root="))
    return None


def _root_entries(root: Path, kind: RuntimeKind) -> set[str]:
    """Container ids from the runtime's own files in ``root`` (runc: ``<id>/state.json``; runsc:
    ``<id>_sandbox:<sandbox id>.state`` and ``.lock``): found even when the binary cannot run."""
    ids: set[str] = set()
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return ids
    for entry in entries:
        if kind is RuntimeKind.RUNC:
            if entry.is_dir(follow_symlinks=False):
                ids.add(entry.name)
        elif entry.name.endswith((".state", ".lock")) and "_sandbox:" in entry.name:
            ids.add(entry.name.partition("_sandbox:")[0])
    return ids


async def _containers(backend: OciRuntime) -> set[str]:
    """Every container id in the backend's root: ``list`` plus the root's entries."""
    root = runtime_root(backend)
    if root is None or not root.is_dir():
        return set()
    ids = await asyncio.to_thread(_root_entries, root, backend.kind)
    try:
        result = await run_command(backend.cli_argv("list", "--format", "json"), timeout=CLI_TIMEOUT, check=False)
    except RuntimeCommandError as exc:
        _log.warning("cannot list %s containers in %s: %s", backend.kind.value, root, exc)
        return ids
    if result.returncode != 0:
        _log.warning("%s list in %s failed: %s", backend.kind.value, root, result.stderr_text.strip()[-500:])
        return ids
    try:
        listed = json.loads(result.stdout or b"null") or []
        ids.update(str(c["id"]) for c in listed if isinstance(c, dict) and "id" in c)
    except (ValueError, TypeError):
        _log.warning("unexpected %s list output: %r", backend.kind.value, result.stdout[:200])
    return ids


def _sandbox_dirs(state_dir: Path) -> set[str]:
    try:
        return {e.name for e in os.scandir(state_dir / "sandboxes") if e.is_dir(follow_symlinks=False)}
    except FileNotFoundError:
        return set()


def _cgroup_children(hier: CgroupHierarchies, parent: str) -> set[str]:
    names: set[str] = set()
    for top in hier.existing(parent):
        try:
            names.update(e.name for e in os.scandir(top) if e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            continue
    return names


def _cgroup_pids(hier: CgroupHierarchies, rel: str) -> set[int]:
    """Every pid in cgroup ``rel`` or below it, in every hierarchy."""
    pids: set[int] = set()
    for top in hier.existing(rel):
        for visit in walk(top):  # nested cgroups of any depth, by fd, no recursion
            try:
                with os.fdopen(os.open("cgroup.procs", os.O_RDONLY | os.O_CLOEXEC, dir_fd=visit.fd), "rb") as procs:
                    text = procs.read().decode(errors="replace")
            except OSError:
                continue
            pids.update(int(p) for p in text.split() if p.isdigit())
    return pids


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _names_state_dir(pid: int, state_dir: Path, proc: Path) -> bool:
    """Whether process ``pid`` names ``state_dir``: in its command line (runsc sandbox and gofer carry
    ``--root=`` and ``--bundle``) or as the upper dir of an overlay in its mount table (a runc container's
    root filesystem)."""
    needle = os.fsencode(state_dir) + b"/"
    if needle in _read_bytes(proc / str(pid) / "cmdline"):
        return True
    try:
        mounts = read_mounts(proc / str(pid) / "mountinfo")
    except OSError:
        return False
    upper = f"{state_dir}/sandboxes/"
    return any((m.option("upperdir") or "").startswith(upper) for m in mounts)


def _valid(sandbox_id: str) -> bool:
    """Whether warren could have made this id; only such ids are turned into cgroup and netns names."""
    try:
        validate_sandbox_id(sandbox_id)
    except InvalidRequestError:
        return False
    return True


# ---------------------------------------------------------------------------------------- stopping


def _thaw(hier: CgroupHierarchies, rel: str) -> None:
    """Thaw a frozen (runc-paused) cgroup so its processes can receive and act on signals."""
    if "freezer" in hier.v1:
        state = hier.v1["freezer"] / rel / "freezer.state"
        try:
            if state.read_text().strip() != "THAWED":
                state.write_text("THAWED")
        except OSError:
            pass
    if hier.v2 is not None:
        freeze = hier.v2 / rel / "cgroup.freeze"
        try:
            if freeze.read_text().strip() == "1":
                freeze.write_text("0")
        except OSError:
            pass


def _identities(hier: CgroupHierarchies, rels: Iterable[str], proc: Path) -> list[ProcessIdentity]:
    found = []
    for rel in rels:
        for pid in sorted(_cgroup_pids(hier, rel)):
            identity = read_identity(pid, "/" + rel, proc=proc)
            if identity is not None:
                found.append(identity)
    return found


async def _stop_processes(hier: CgroupHierarchies, rels: Sequence[str], grace_s: float, proc: Path,
                          acc: _Acc) -> None:
    """Every process in the cgroups ``rels``: SIGTERM, grace, identity re-check, SIGKILL; then sweep."""
    if not rels:
        return
    for rel in rels:
        _thaw(hier, rel)
    first = _identities(hier, rels, proc)
    result = await terminate_group(first, grace_s, proc=proc)
    if first:
        _log.info("orphaned processes %s: %d exited on SIGTERM, SIGKILLed %s, spared (pid reused or moved) %s, "
                  "survived %s", sorted(i.pid for i in first), len(result.terminated), [i.pid for i in result.killed],
                  [i.pid for i in result.spared], [i.pid for i in result.survivors])
    acc.processes.extend(i.pid for i in (*result.terminated, *result.killed) if i not in result.survivors)
    seen = set(first)
    for _ in range(SWEEP_ROUNDS):
        fresh = [i for i in _identities(hier, rels, proc) if i not in seen]
        if not fresh:
            break
        seen.update(fresh)
        swept = await terminate_group(fresh, 0.0, proc=proc)
        acc.processes.extend(i.pid for i in (*swept.terminated, *swept.killed) if i not in swept.survivors)


# ---------------------------------------------------------------------------------------- cleaning


async def _peer_veth(netns: str, veth_prefix: str) -> tuple[str, int] | None:
    """The root-namespace veth (name, ifindex) whose peer sits in ``netns``, if it has our prefix."""
    try:
        result = await run_command(["ip", "-j", "-n", netns, "link", "show"], timeout=IP_TIMEOUT, check=False)
    except RuntimeCommandError:
        return None
    if result.returncode != 0:
        return None
    try:
        links = json.loads(result.stdout or b"[]")
    except ValueError:
        return None
    # (index of the peer in the root namespace, index of the end inside): both must match, so a root link
    # that merely has the same index as a peer living in some third namespace is not taken for ours.
    pairs = {(int(link["link_index"]), int(link["ifindex"])) for link in links
             if isinstance(link, dict) and "link_index" in link and "ifindex" in link}
    for name in _links_with_prefix(veth_prefix):
        index = _ifindex(name)
        if index is not None and (index, _ifindex(name, "iflink")) in pairs:
            return name, index
    return None


def _links_with_prefix(prefix: str) -> list[str]:
    try:
        return [n for n in os.listdir("/sys/class/net") if n.startswith(prefix)]
    except FileNotFoundError:
        return []


def _ifindex(name: str, attr: str = "ifindex") -> int | None:
    """``ifindex`` of a root-namespace link, or ``iflink`` (its veth peer's index)."""
    try:
        return int(Path("/sys/class/net", name, attr).read_text())
    except (OSError, ValueError):
        return None


def _known_networks(state_dir: Path, known: Collection[str]) -> list[SandboxNetwork]:
    nets = []
    for sid in known:
        if not _valid(sid):
            continue
        record = load_record(SandboxPaths(state_dir / "sandboxes" / sid))
        if record is not None and record.network is not None:
            nets.append(record.network)
    return nets


class _Cleaner:
    """The per-orphan removal steps, sharing what discovery found."""

    def __init__(self, *, backends: Sequence[OciRuntime], containers: Mapping[OciRuntime, set[str]],
                 network: NetworkManager, state_dir: Path, cgroup_parent: str, hier: CgroupHierarchies,
                 known_networks: Sequence[SandboxNetwork], acc: _Acc) -> None:
        self.backends = backends
        self.containers = containers
        self.network = network
        self.state_dir = state_dir
        self.cgroup_parent = cgroup_parent
        self.hier = hier
        self.known_slots = {n.slot for n in known_networks}
        self.known_ifs = {n.host_if for n in known_networks}
        self.acc = acc

    async def clean(self, sandbox_id: str) -> None:
        errors: list[str] = []
        root = self.state_dir / "sandboxes" / sandbox_id
        record = load_record(SandboxPaths(root)) if root.is_dir() else None
        valid = _valid(sandbox_id)
        rel = f"{self.cgroup_parent}/{sandbox_id}"
        cgroups_before = self.hier.existing(rel) if valid else []

        for backend in self.backends:
            if sandbox_id in self.containers.get(backend, set()):
                await self._step(errors, "container", self._delete_container, backend, sandbox_id)
        await self._step(errors, "overlay", self._unmount_all, root)
        if valid:
            await self._step(errors, "network", self._remove_network, sandbox_id, record)
            await self._step(errors, "cgroups", self._remove_cgroups, rel)
        self.acc.cgroups.extend(str(d) for d in cgroups_before if not d.exists())
        if not errors and root.is_dir():
            await self._step(errors, "files", self._remove_dir, root)
        if errors:
            self.acc.failed[sandbox_id] = "; ".join(errors)
            _log.error("orphan %s not fully removed (retried at next start): %s", sandbox_id, "; ".join(errors))
        else:
            _log.info("removed orphaned sandbox %s", sandbox_id)

    @staticmethod
    async def _step(errors: list[str], what: str, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        try:
            await fn(*args)
        except (RuntimeFailure, OSError) as exc:
            errors.append(f"{what}: {exc}")

    async def _delete_container(self, backend: OciRuntime, sandbox_id: str) -> None:
        # The runtime re-checks the container's init start time itself before any kill it sends.
        result = await run_command(backend.cli_argv("delete", "--force", sandbox_id), timeout=CLI_TIMEOUT,
                                   check=False)
        if result.returncode != 0 and "not exist" not in result.stderr_text:
            raise RuntimeCommandError(result.argv, f"exit status {result.returncode}",
                                      returncode=result.returncode, stderr=result.stderr_text.strip()[-500:])
        if result.returncode == 0:
            self.acc.containers.append(f"{backend.kind.value}:{sandbox_id}")

    async def _unmount_all(self, root: Path) -> None:
        mounted = await asyncio.to_thread(mounts_under, root)
        for point in sorted(mounted, key=lambda p: len(p.parts), reverse=True):
            await asyncio.to_thread(unmount, point)
            self.acc.mounts.append(str(point))

    async def _remove_network(self, sandbox_id: str, record: SandboxRecord | None) -> None:
        name = self.network.netns_name(sandbox_id)
        peer = await _peer_veth(name, self.network.config.veth_prefix) if netns_exists(name) else None
        host_if = peer[0] if peer is not None and _ifindex(peer[0]) == peer[1] else None
        had_netns = netns_exists(name)
        if had_netns or host_if is not None:
            await delete_netns(name, host_if)
            if had_netns:
                self.acc.netns.append(name)
            if host_if is not None:
                self.acc.veths.append(host_if)
        net = record.network if record is not None else None
        if net is None:
            return
        # The record's slot and nft element, unless a known sandbox has them now (a crash between freeing
        # a slot and saving the record can leave two records naming one slot).
        if net.slot not in self.known_slots:
            self.network.pool.release(net.slot)
        if net.host_if not in self.known_ifs and not link_exists(net.host_if):
            if not net.allow_internet:
                await self.network.nat.unblock_internet(net.host_if)
            if not net.egress.is_open:
                await self.network.egress_rules.remove(net.host_if)

    async def _remove_cgroups(self, rel: str) -> None:
        left = await asyncio.to_thread(self.hier.remove, rel)
        if left:
            raise RuntimeFailure(f"cgroups still in use: {', '.join(map(str, left))}")

    async def _remove_dir(self, root: Path) -> None:
        await asyncio.to_thread(remove_tree, root)
        self.acc.dirs.append(str(root))


def _find_orphans(known: frozenset[str], containers: set[str], *, state_dir: Path, hier: CgroupHierarchies,
                  cgroup_parent: str, netns_prefix: str, proc: Path) -> tuple[list[str], list[str]]:
    """(orphan ids, unattributed cgroup dirs and netns names); see the module docstring."""
    owned = _sandbox_dirs(state_dir) | containers
    unattributed: list[str] = []
    for name in sorted(_cgroup_children(hier, cgroup_parent) - known - owned):
        rel = f"{cgroup_parent}/{name}"
        if any(_names_state_dir(pid, state_dir, proc) for pid in _cgroup_pids(hier, rel)):
            owned.add(name)  # its dir and runtime state are gone, but its processes still name ours
        else:
            unattributed.extend(str(d) for d in hier.existing(rel))
    orphans = sorted(owned - known)
    claimed = known | set(orphans)
    unattributed.extend(ns for ns in list_netns(netns_prefix) if ns[len(netns_prefix):] not in claimed)
    return orphans, unattributed


# ---------------------------------------------------------------------------------------- entry point


async def reap_orphans(
    *,
    known: Collection[str],
    backends: Sequence[OciRuntime],
    network: NetworkManager,
    state_dir: Path,
    cgroup_parent: str,
    grace_s: float = 5.0,
    cgroups: CgroupHierarchies | None = None,
    proc: Path = PROC,
) -> ReapReport:
    """Stop and remove every sandbox this node owns (see the module docstring) whose id is not in
    ``known``. Call it once at start-up, after re-adopting the known ones and before serving."""
    known = frozenset(known)
    state_dir = await asyncio.to_thread(state_dir.absolute)
    cgroup_parent = cgroup_parent.strip("/")
    hier = cgroups or CgroupHierarchies.detect()
    acc = _Acc()

    containers = {backend: await _containers(backend) for backend in backends}
    orphans, unattributed = await asyncio.to_thread(
        _find_orphans, known, set().union(*containers.values()), state_dir=state_dir, hier=hier,
        cgroup_parent=cgroup_parent, netns_prefix=network.config.netns_prefix, proc=proc,
    )
    acc.unattributed.extend(unattributed)
    if acc.unattributed:
        _log.warning("left alone: under our cgroup parent or netns prefix, but no marker of this node names "
                     "them (another node's on this host, or left by a wiped state dir): %s",
                     ", ".join(acc.unattributed))
    if not orphans:
        return acc.freeze()
    _log.warning("reaping %d orphaned sandboxes unknown to the store: %s", len(orphans), ", ".join(orphans))
    acc.orphans.extend(orphans)

    rels = [f"{cgroup_parent}/{sid}" for sid in orphans if _valid(sid)]
    await _stop_processes(hier, rels, grace_s, proc, acc)
    cleaner = _Cleaner(backends=backends, containers=containers, network=network, state_dir=state_dir,
                       cgroup_parent=cgroup_parent, hier=hier, known_networks=_known_networks(state_dir, known),
                       acc=acc)
    for sid in orphans:
        await cleaner.clean(sid)
    return acc.freeze()

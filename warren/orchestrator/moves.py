"""What moves between nodes through the shared snapshot store: paused sandboxes and snapshots.

A node with a shared snapshot store (``--shared-store``) *parks* every sandbox it pauses: a copy of
the paused sandbox (its filesystem and, for gVisor, its memory image; a frozen runc sandbox's memory
cannot leave its node, so it travels as its files) goes to ``paused/<sandbox id>`` in the store,
in the background, with the sandbox's record beside it. The copy is current as long as the sandbox
stays paused: a resume here deletes it, and a copy whose sandbox resumed while it was uploading is
deleted when the upload ends.

Another node *adopts* a parked sandbox (the gateway asks it when the sandbox's node is dead or
draining): it pulls the copy into ``<state>/moved/<id>``, checks that it can run it (the template
and the runtime hash, 409 naming what it misses), and holds the sandbox as paused with the same id,
access token and metadata. Its resume restores from that dir, then the copy in the store is deleted.
The node that parked it *releases* its own copy when told (or when it finds the sandbox bound to
another node): the local sandbox goes, the store's copy stays.

Snapshots taken through the API are *published* to ``snapshots/<id>`` the same way (in the
background); a create naming a snapshot this node lacks pulls it from the store into the node's
repository first, and a delete removes the shared copy too. gVisor templates' seals stay local.

One task (:meth:`Mover.run`, owned by the node) parks and publishes; pauses and snapshots only queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from .. import trees
from ..errors import ConflictError, InvalidRequestError, InvalidStateError, NotFoundError, WarrenError
from ..runtime.base import PauseMode, RuntimeKind
from ..snapshots import SnapshotManifest, SnapshotRepository
from ..snapshots.manifest import ManifestError
from ..store import SandboxRecord, TemplateRepo, sandbox_of_json, sandbox_to_json
from .runtimes import RuntimeSet
from .sandbox import Sandbox
from .states import SandboxState
from .table import SandboxTable

log = logging.getLogger(__name__)

SCRATCH = ".scratch"
"""The shared store's scratch dir inside the mover's work dir (``node.py`` gives it)."""
PARKED = "paused/"
"""The store's key prefix of parked sandboxes."""
SHARED_SNAPSHOTS = "snapshots/"
"""The store's key prefix of snapshots (any node can start sandboxes from them)."""
TEMPLATE_SEAL_PREFIX = "template:"
"""What the names of gVisor templates' sealed snapshots start with (``launcher.template_snapshot_name``)."""
_FORMAT = 1
_PARK = "park"
_PUBLISH = "publish"


class Bundle(Protocol):
    """A complete entry of the shared store (``warren.snapshots.shared.BundleManifest``)."""

    @property
    def meta(self) -> dict[str, Any]: ...


class SharedStore(Protocol):
    """The shared snapshot store (``warren.snapshots.shared.SharedSnapshots``)."""

    async def push(self, key: str, src: Path, meta: dict[str, Any]) -> Any: ...

    async def pull(self, key: str, dest: Path) -> Any: ...

    async def manifest(self, key: str) -> Any: ...

    async def delete(self, key: str) -> None: ...

    async def list(self, prefix: str) -> list[Any]: ...


OwnerCheck = Callable[[str], Awaitable[bool]]
"""``owns(sandbox_id)``: whether the sandbox is this node's to park (:meth:`Mover.check_owner`)."""


def parked_key(sandbox_id: str) -> str:
    return PARKED + sandbox_id


def shared_snapshot_key(snapshot_id: str) -> str:
    return SHARED_SNAPSHOTS + snapshot_id


def _shareable(manifest: SnapshotManifest) -> bool:
    """User snapshots travel; a gVisor template's seal is this node's own (each node seals its templates)."""
    return not any(n.startswith(TEMPLATE_SEAL_PREFIX) for n in manifest.names)


def _names(meta: dict[str, Any]) -> tuple[str, ...]:
    try:
        return SnapshotManifest.decode(str(meta["manifest"]).encode()).names
    except (KeyError, ManifestError):
        return ()


class Mover:
    def __init__(
        self,
        *,
        table: SandboxTable,
        runtimes: RuntimeSet,
        templates: TemplateRepo,
        shared: SharedStore | None,
        snapshots: SnapshotRepository | None,
        work_dir: Path,
        clock: Callable[[], float],
    ) -> None:
        self._table = table
        self._runtimes = runtimes
        self._templates = templates
        self._shared = shared
        self._dir = work_dir
        self._clock = clock
        self._snapshots = snapshots
        self._queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._parked: set[str] = set()
        self._published: set[str] = set()
        self._releasing: set[str] = set()
        self._owns: OwnerCheck | None = None
        self._generation: dict[str, int] = {}
        """Bumped by every resume: a copy taken at an older generation is stale when its upload ends."""
        table.on_discarded(self._discarded)

    def check_owner(self, owns: OwnerCheck) -> None:
        """Park only sandboxes ``owns(id)`` says are this node's (the cluster's binding): a node back from
        the dead still holds paused sandboxes that moved elsewhere meanwhile, and must not overwrite their
        parked copies with its stale ones before it releases them."""
        self._owns = owns

    @property
    def enabled(self) -> bool:
        return self._shared is not None

    def _store(self) -> SharedStore:
        if self._shared is None:
            raise ConflictError("this node has no shared snapshot store (--shared-store): sandboxes cannot move")
        return self._shared

    async def sweep(self) -> None:
        """At start, before anything moves: what a crash left in the work dir (half-made copies, the
        store's scratch files) goes; the copies of adopted sandboxes, which their records name, stay."""
        kept = {Path(s.record.binding.restore_dir).name for s in self._table if s.record.binding.restore_dir}

        def sweep() -> None:
            if not self._dir.is_dir():
                return
            for entry in self._dir.iterdir():
                if entry.name == SCRATCH:
                    for item in entry.iterdir():
                        _remove(item)
                elif entry.name not in kept:
                    log.info("removing %s, left by an interrupted move", entry)
                    _remove(entry)

        await asyncio.to_thread(sweep)

    # ----- parking --------------------------------------------------------------------------------

    def paused(self, sandbox_id: str) -> None:
        """A sandbox was paused: park it (in the background)."""
        if self._shared is not None:
            self._queue.put_nowait((_PARK, sandbox_id))

    async def resumed(self, sandbox_id: str) -> None:
        """A sandbox was resumed here: its parked copy, if any, is stale now."""
        self._generation[sandbox_id] = self._generation.get(sandbox_id, 0) + 1
        if self._shared is not None and sandbox_id in self._parked:
            self._parked.discard(sandbox_id)
            await self._delete(sandbox_id)

    def is_parked(self, sandbox_id: str) -> bool:
        return sandbox_id in self._parked

    async def run(self) -> None:
        """Park what pauses and publish what is snapshotted, one at a time; at start, whatever is paused
        here and not parked yet, and every snapshot of this node not in the store yet."""
        if self._shared is None:
            return
        await asyncio.to_thread(self._dir.mkdir, parents=True, exist_ok=True)
        with contextlib.suppress(WarrenError):
            self._parked = {str(b.meta.get("sandbox_id")) for b in await self._shared.list(PARKED)}
        with contextlib.suppress(WarrenError):
            self._published = {str(b.meta.get("snapshot_id")) for b in await self._shared.list(SHARED_SNAPSHOTS)}
        for sandbox in list(self._table):
            if sandbox.state is SandboxState.PAUSED and sandbox.id not in self._parked:
                self._queue.put_nowait((_PARK, sandbox.id))
        for manifest in await self._local_snapshots():
            if manifest.snapshot_id not in self._published:
                self._queue.put_nowait((_PUBLISH, manifest.snapshot_id))
        while True:
            job, ident = await self._queue.get()
            try:
                await (self.park(ident) if job == _PARK else self._publish(ident))
            except Exception:
                log.exception("%s %s in the shared store failed; it stays on this node only",
                              "parking sandbox" if job == _PARK else "publishing snapshot", ident)  # fmt: skip

    async def park(self, sandbox_id: str) -> bool:
        """Copy a paused sandbox to the shared store; False when there is nothing (left) to park."""
        store = self._store()
        sandbox = self._table.lookup(sandbox_id)
        if sandbox is None or sandbox_id in self._parked:
            return False
        if self._owns is not None and not await self._owns(sandbox_id):
            log.info("not parking sandbox %s: it is bound to another node (it moved)", sandbox_id)
            return False
        staging = self._dir / f"park-{sandbox_id}-{secrets.token_hex(4)}"
        try:
            async with sandbox.lock:
                if sandbox.state is not SandboxState.PAUSED or sandbox.record.binding.restore_dir:
                    return False
                generation = self._generation.get(sandbox_id, 0)
                record = sandbox.record
                await asyncio.to_thread(staging.mkdir, parents=True)
                contents = await self._runtimes.of(sandbox.kind).snapshot(sandbox_id, staging)
            meta = {"format": _FORMAT, "sandbox_id": sandbox_id, "record": sandbox_to_json(record),
                    "memory": contents.memory, "parked_at": self._clock()}  # fmt: skip
            await store.push(parked_key(sandbox_id), staging, meta)
        finally:
            await asyncio.shield(asyncio.to_thread(_remove, staging))
        if self._generation.get(sandbox_id, 0) != generation or self._table.lookup(sandbox_id) is None:
            await self._delete(sandbox_id)  # resumed or gone while it uploaded: the copy is stale
            return False
        self._parked.add(sandbox_id)
        log.info("parked paused sandbox %s in the shared store (memory=%s)", sandbox_id, contents.memory)
        return True

    async def park_all(self) -> int:
        """Park every paused sandbox not parked yet (a drain); the number parked."""
        count = 0
        for sandbox in list(self._table):
            if sandbox.state is SandboxState.PAUSED and sandbox.id not in self._parked:
                try:
                    count += await self.park(sandbox.id)
                except Exception:
                    log.exception("parking sandbox %s failed", sandbox.id)
        return count

    # ----- snapshots in the shared store -----------------------------------------------------------

    def snapshotted(self, snapshot_id: str) -> None:
        """A snapshot was taken here: publish it (in the background), so any node can start from it."""
        if self._shared is not None:
            self._queue.put_nowait((_PUBLISH, snapshot_id))

    def is_published(self, snapshot_id: str) -> bool:
        return snapshot_id in self._published

    async def _local_snapshots(self) -> list[SnapshotManifest]:
        if self._snapshots is None:
            return []
        return [m for m in await asyncio.to_thread(self._snapshots.list) if _shareable(m)]

    async def _publish(self, snapshot_id: str) -> None:
        store, repo = self._store(), self._snapshots
        if repo is None or snapshot_id in self._published:
            return
        try:
            manifest = await asyncio.to_thread(repo.get, snapshot_id)
        except NotFoundError:
            return  # deleted meanwhile
        meta = {"format": _FORMAT, "snapshot_id": snapshot_id, "manifest": manifest.encode().decode()}
        await store.push(shared_snapshot_key(snapshot_id), repo.data_dir(snapshot_id), meta)
        self._published.add(snapshot_id)
        if await asyncio.to_thread(repo.find, snapshot_id) is None:  # deleted while it uploaded
            await self.unpublish(snapshot_id)
        else:
            log.info("published snapshot %s in the shared store", snapshot_id)

    async def fetch(self, ref: str) -> SnapshotManifest | None:
        """A snapshot by id or name from the shared store, pulled into this node's repository (None: the
        store has none, or this node has no store)."""
        repo = self._snapshots
        if self._shared is None or repo is None:
            return None
        bundle = None
        with contextlib.suppress(InvalidRequestError):
            bundle = await self._shared.manifest(shared_snapshot_key(ref))
        if bundle is None:
            bundle = next((b for b in await self._shared.list(SHARED_SNAPSHOTS) if ref in _names(b.meta)), None)
        if bundle is None:
            return None
        try:
            manifest = SnapshotManifest.decode(str(bundle.meta["manifest"]).encode())
        except (KeyError, ManifestError) as exc:
            raise ConflictError(f"the shared copy of snapshot {ref} is unreadable: {exc}") from exc
        try:
            async with repo.writing(manifest.snapshot_id) as data:
                await self._shared.pull(shared_snapshot_key(manifest.snapshot_id), data)
                await repo.commit(data, manifest)
        except ConflictError:  # another create pulled it a moment ago
            pass
        self._published.add(manifest.snapshot_id)
        log.info("pulled snapshot %s from the shared store", manifest.snapshot_id)
        return await asyncio.to_thread(repo.get, manifest.snapshot_id)

    async def unpublish(self, snapshot_id: str) -> None:
        """A snapshot was deleted: its shared copy goes too."""
        self._published.discard(snapshot_id)
        if self._shared is not None:
            try:
                await self._shared.delete(shared_snapshot_key(snapshot_id))
            except WarrenError as exc:
                log.warning("could not delete snapshot %s from the shared store: %s", snapshot_id, exc)

    # ----- adopting and releasing -----------------------------------------------------------------

    async def adopt(self, sandbox_id: str) -> SandboxRecord:
        """Take over a sandbox parked by another node: held here as paused, restored by its resume.

        404 when the store has no parked copy; 409 when this node cannot run it (its template or
        runtime hash is missing here) or already has a sandbox of that id that is not paused."""
        store = self._store()
        held = self._table.lookup(sandbox_id)
        if held is not None:
            if held.state is SandboxState.PAUSED:
                return held.record
            raise ConflictError(f"sandbox {sandbox_id} is already {held.state.value} on this node")
        bundle = await store.manifest(parked_key(sandbox_id))
        if bundle is None:
            raise NotFoundError(f"sandbox {sandbox_id} has no copy in the shared store")
        try:
            parked = sandbox_of_json(bundle.meta["record"])
            memory = bool(bundle.meta.get("memory"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConflictError(f"the parked copy of sandbox {sandbox_id} is unreadable: {exc}") from exc
        record = await self._local_record(parked, memory)
        dest = self._dir / sandbox_id
        await asyncio.to_thread(_remove, dest)
        await asyncio.to_thread(dest.mkdir, parents=True)
        try:
            await store.pull(parked_key(sandbox_id), dest)
            record = dataclasses.replace(
                record, binding=dataclasses.replace(record.binding, restore_dir=str(dest))
            )
            await self._table.store.put(record)
        except BaseException:
            await asyncio.shield(asyncio.to_thread(_remove, dest))
            raise
        self._table.add(record)
        self._parked.add(sandbox_id)  # the store's copy is current until the resume here
        log.info("adopted paused sandbox %s from the shared store (memory=%s)", sandbox_id, memory)
        return record

    async def _local_record(self, parked: SandboxRecord, memory: bool) -> SandboxRecord:
        """The parked record as this node holds it: its template's layers here, its runtime checked."""
        kind = RuntimeKind(parked.runtime)
        self._runtimes.available(kind)
        await self._runtimes.stage(parked.binding.runtime_hash, kind)  # 409 naming the hash when missing
        # By id, else by name: each node imports or builds its own copy of a template (built-ins, imports).
        template = await self._templates.find(parked.template_id)
        if template is None and parked.alias:
            template = await self._templates.find(parked.alias)
        if template is None:
            named = f"{parked.template_id} ({parked.alias})" if parked.alias else parked.template_id
            raise ConflictError(f"template {named} of sandbox {parked.id} is not on this node")
        image = dataclasses.replace(parked.image, layers=template.layers)
        mode = PauseMode.MEMORY if memory else PauseMode.FILESYSTEM
        return dataclasses.replace(
            parked,
            state=SandboxState.PAUSED.value,
            address=None,
            image=image,
            binding=dataclasses.replace(parked.binding, init_pid=None, pause_mode=mode),
        )

    async def release(self, sandbox_id: str) -> None:
        """Drop this node's copy of a paused sandbox that moved to another node (the store's copy stays).

        404 when it is not here; 409 when it is not paused (it runs here: it did not move)."""
        sandbox = self._table.get(sandbox_id)
        async with sandbox.lock:
            if not self._table.holds(sandbox):
                raise NotFoundError(f"sandbox {sandbox_id} not found")
            if sandbox.state is not SandboxState.PAUSED:
                raise InvalidStateError(f"sandbox {sandbox_id} is {sandbox.state.value} here: it did not move")
            self._releasing.add(sandbox_id)
            try:
                await sandbox.set_state(SandboxState.KILLING)
                await asyncio.shield(self._table.discard(sandbox))
            finally:
                self._releasing.discard(sandbox_id)
        log.info("released sandbox %s: it moved to another node", sandbox_id)

    async def restored(self, sandbox: Sandbox) -> None:
        """A moved sandbox's resume restored it: its pulled copy goes, and the store's (stale now)."""
        restore_dir = sandbox.record.binding.restore_dir
        if restore_dir is not None:
            await sandbox.update(binding=dataclasses.replace(sandbox.record.binding, restore_dir=None))
            await asyncio.to_thread(_remove, Path(restore_dir))

    async def _discarded(self, record: SandboxRecord) -> None:
        if record.binding.restore_dir is not None:
            await asyncio.to_thread(_remove, Path(record.binding.restore_dir))
        parked = record.id in self._parked
        self._parked.discard(record.id)
        if parked and record.id not in self._releasing:
            await self._delete(record.id)
        self._generation.pop(record.id, None)

    async def _delete(self, sandbox_id: str) -> None:
        if self._shared is None:
            return
        try:
            await self._shared.delete(parked_key(sandbox_id))
        except WarrenError as exc:
            log.warning("could not delete the parked copy of %s from the shared store: %s", sandbox_id, exc)


def _remove(path: Path) -> None:
    trees.remove_tree(path)  # a missing path is fine; nothing in it is followed

"""The node's template layers: pins, the lock that orders gc against new layers, and garbage collection.

A layer is in use while any template, sandbox (running, paused or mounted), snapshot, or build or pull
in progress (a *pin*) refers to it. :meth:`Layers.gc` removes the rest: build layers under
``state_dir/layers/``, given candidates there, unused image-store layers, and stale uploads.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from warren.errors import HostError
from warren.images import LayerStore
from warren.mountinfo import SELF, read_mounts
from warren.store import TemplateRepo
from warren.templates._fs import remove_tree
from warren.templates.model import LAYER_PREFIX
from warren.templates.uploads import UploadStore
from warren.trees import QUARANTINE, move_aside

log = logging.getLogger(__name__)

HALF_SEALED = ".tmp-" + LAYER_PREFIX


@dataclass(frozen=True)
class Usage:
    """What must not be deleted: templates sandboxes were created from, and layers anything still uses."""

    template_ids: frozenset[str] = frozenset()
    layers: frozenset[str] = frozenset()


class Layers:
    """Pins and garbage collection of the layers under ``layers_dir`` and in the image store.

    ``lock`` is held by gc and by whoever makes a layer or a template record refer to one (a gc must
    not see a new layer before it is pinned, nor a template about to be written without it).
    """

    def __init__(
        self,
        *,
        layers_dir: Path,
        templates: TemplateRepo,
        image_store: LayerStore,
        uploads: UploadStore,
        usage: Callable[[], Usage],
        uploads_in_use: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        self.dir = layers_dir
        self.lock = asyncio.Lock()
        self._templates = templates
        self._image_store = image_store
        self._uploads = uploads
        self._usage = usage
        self._uploads_in_use = uploads_in_use
        self._pins: Counter[str] = Counter()

    def pin(self, layers: Iterable[str], pinned: list[str]) -> None:
        """Keep ``layers`` from gc until :meth:`unpin` of ``pinned`` (which records them)."""
        for layer in layers:
            self._pins[layer] += 1
            pinned.append(layer)

    def unpin(self, pinned: list[str]) -> None:
        for layer in pinned:
            self._pins[layer] -= 1
            if self._pins[layer] <= 0:
                del self._pins[layer]
        pinned.clear()

    def pinned(self) -> frozenset[str]:
        return frozenset(self._pins)

    async def drop_half_sealed(self, state_dir: Path) -> None:
        """At node start: remove layers a crash left half sealed (quarantined when they cannot go)."""
        if not self.dir.is_dir():
            return
        for entry in sorted(self.dir.iterdir()):
            if entry.name.startswith(HALF_SEALED):
                try:
                    await asyncio.to_thread(remove_tree, entry)
                except HostError as exc:
                    await asyncio.to_thread(move_aside, entry, state_dir / QUARANTINE,
                                            f"a half-sealed build layer that cannot be removed ({exc})")  # fmt: skip

    async def cache_index(self) -> dict[str, tuple[str, ...]]:
        """Cache key -> layers, from every template's build record (entries whose layers are gone skipped)."""
        records = await self._templates.all()

        def index() -> dict[str, tuple[str, ...]]:
            out: dict[str, tuple[str, ...]] = {}
            for record in records:
                for entry in record.build.cache:
                    if entry.layers and all(Path(p).is_dir() for p in entry.layers):
                        out.setdefault(entry.key, entry.layers)
            return out

        return await asyncio.to_thread(index)

    async def gc(self, candidates: Iterable[str] = ()) -> list[str]:
        """Remove layers nothing uses: build layers, the given candidates under ``layers_dir``, image layers.

        In use: any template's layers, any sandbox's or snapshot's (``usage``), any overlay mounted
        now, and the pins of builds and pulls in progress. Returns the removed paths.
        """
        async with self.lock:
            records = await self._templates.all() + await self._templates.tags.builds()
            used = {p for r in records for p in r.layers} | set(self._usage().layers) | set(self._pins)
            used |= await asyncio.to_thread(mounted_lower_dirs)
            removed: list[str] = []
            wanted = {str(p) for p in candidates}
            if self.dir.is_dir():
                for entry in sorted(self.dir.iterdir()):
                    path = str(entry)
                    own = entry.name.startswith(LAYER_PREFIX) or path in wanted
                    if own and not entry.name.startswith(".") and path not in used and entry.is_dir():
                        await asyncio.to_thread(remove_tree, entry)
                        removed.append(path)
            store_dir = self._image_store.layers_dir
            diff_ids = {f"sha256:{Path(p).name}" for p in used if Path(p).parent == store_dir}
            for gone in await asyncio.to_thread(self._image_store.gc, diff_ids):
                removed.append(str(self._image_store.root / gone))
            keep = {h for r in records for h in r.build.files} | set(self._uploads_in_use())
            await asyncio.to_thread(self._uploads.gc, keep)
        if removed:
            log.info("removed unused layers: %s", ", ".join(removed))
        return removed


def mounted_lower_dirs(mountinfo: Path = SELF) -> set[str]:
    """Every ``lowerdir`` of the overlay mounts in our mount namespace."""
    try:
        mounts = read_mounts(mountinfo)
    except OSError:
        return set()
    lowers = (m.option("lowerdir") or "" for m in mounts if m.fstype == "overlay")
    return {p for lower in lowers for p in lower.split(":") if p}


__all__ = ["HALF_SEALED", "Layers", "Usage", "mounted_lower_dirs"]

"""Sealing: a finished build sandbox's filesystem changes become one read-only layer.

The runtime writes them (:meth:`warren.runtime.base.Runtime.export_filesystem`: overlay whiteouts and
opaque xattrs included, owners 0-based) into ``layers/.tmp-build-<key>-<rand>/``, which is then renamed
to ``layers/build-<key>-<rand>/`` and pinned under the layers lock, so no gc sees it unpinned. A failed
or cancelled seal leaves no directory (a crash leaves a ``.tmp-`` one, removed at the next start).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path
from typing import Protocol

from warren.errors import HostError
from warren.runtime.base import PauseMode
from warren.templates._fs import remove_tree
from warren.templates.layers import HALF_SEALED, Layers
from warren.templates.model import LAYER_PREFIX
from warren.trees import fsync_dir


class ExportingRuntime(Protocol):
    """The part of ``warren.runtime.base.Runtime`` sealing uses."""

    async def pause(self, sandbox_id: str, mode: PauseMode) -> None: ...

    async def export_filesystem(self, sandbox_id: str, dest: Path) -> None: ...


async def seal(runtime: ExportingRuntime, sandbox_id: str, key: str, layers: Layers, pinned: list[str]) -> Path:
    """End the sandbox's processes and make its filesystem the layer for cache key ``key``; the layer is
    pinned in ``pinned`` (see :meth:`Layers.pin`). The caller stops the sandbox afterwards."""
    await runtime.pause(sandbox_id, PauseMode.FILESYSTEM)
    name = f"{LAYER_PREFIX}{key[:16]}-{secrets.token_hex(4)}"
    final = layers.dir / name
    tmp = layers.dir / f"{HALF_SEALED}{name[len(LAYER_PREFIX):]}"
    async with layers.lock:  # a gc must not see the new layer before it is pinned
        try:
            await asyncio.to_thread(layers.dir.mkdir, parents=True, exist_ok=True)
            await runtime.export_filesystem(sandbox_id, tmp)
            await asyncio.to_thread(_publish, tmp, final)
        except BaseException:
            await asyncio.shield(asyncio.to_thread(_discard, tmp))
            raise
        layers.pin([str(final)], pinned)
    return final


def _publish(tmp: Path, final: Path) -> None:
    try:
        os.chmod(tmp, 0o755)
        os.rename(tmp, final)
    except OSError as exc:
        raise HostError(f"cannot move the build layer into {final}: {exc}") from exc
    fsync_dir(final.parent)


def _discard(tmp: Path) -> None:
    if tmp.exists() or tmp.is_symlink():
        remove_tree(tmp)


__all__ = ["ExportingRuntime", "seal"]

"""Sandbox snapshots of the OCI backend: the directory format, its checks, and the file copies.

:meth:`OciRuntime.snapshot <warren.runtime.oci.runtime.OciRuntime.snapshot>` fills an empty directory
the caller made; :meth:`~warren.runtime.oci.runtime.OciRuntime.restore` reads one (never writes it)::

    <snapshot>/
      meta.json      SnapshotMeta: kind, memory flag, runsc platform, agent bundle, resources, source
      upper/         the sandbox's overlay upper dir (its disk), copied while no process could write
      checkpoint/    gVisor only: the memory image (``runsc checkpoint --image-path``), taken at the same
                     moment as ``upper/``; a memory image restored onto any other upper silently diverges
                     from its files (guest-agent-notes B8)

Copies are :func:`warren.trees.copy_tree` in a worker thread (iterative and descriptor-based, so a tree
of any depth made inside the sandbox copies, and no symlink is ever followed): owners (optionally mapped),
modes (setuid too), timestamps, symlinks, hard links within the tree, fifos, and every xattr, including
overlayfs' ``trusted.overlay.*`` (opaque dirs, origin) and the 0/0 character-device whiteouts; any other
device node and sockets are skipped. A copy of an upper dir mounted over the same lowers shows the same
merged tree. The only difference is the link count of whiteouts: overlayfs hard-links them to one shared
inode in its work dir, and the copy has its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from warren import trees
from warren.errors import InvalidRequestError, RuntimeFailure
from warren.runtime.base import Resources, RuntimeKind

__all__ = [
    "COPY_TIMEOUT",
    "SNAPSHOT_FORMAT",
    "RestoreSource",
    "SnapshotMeta",
    "bundle_id",
    "check_empty_dir",
    "clear_dir",
    "copy_tree",
    "new_meta",
    "open_snapshot",
]

SNAPSHOT_FORMAT = 1
"""Bumped when the directory layout or ``meta.json`` changes incompatibly."""

COPY_TIMEOUT = 1800.0
"""Seconds for one copy of an upper dir or a memory image (a few GB on a slow disk)."""

META = "meta.json"
UPPER = "upper"
CHECKPOINT = "checkpoint"


def bundle_id(agent_bundle: Path) -> str:
    """The agent bundle's identity: its directory name ``agent-<content hash>`` (see ``agent_bundle``)."""
    return agent_bundle.name


@dataclass(frozen=True)
class SnapshotMeta:
    """``meta.json``: what the snapshot holds and what a restore with memory must match."""

    kind: RuntimeKind
    memory: bool
    """True when ``checkpoint/`` holds a memory image."""
    platform: str | None
    """The runsc ``--platform`` (gVisor); None for runc."""
    runtime_binary: str
    runtime_version: str | None
    agent_bundle: str
    """Host path of the agent bundle the sandbox ran with (bind-mounted at ``/.agent``)."""
    agent_bundle_id: str
    """:func:`bundle_id` of it: a memory image only restores with the same bundle content."""
    resources: Resources
    source_id: str
    source_state: str
    """``running`` or ``paused``: the source's state when the snapshot was taken."""
    created_at: float
    """Unix time."""

    def to_json(self) -> str:
        data = asdict(self)
        data["kind"] = str(self.kind)
        return json.dumps({"format": SNAPSHOT_FORMAT, **data}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SnapshotMeta:
        data: dict[str, Any] = json.loads(text)
        if data.pop("format", None) != SNAPSHOT_FORMAT:
            raise ValueError("unknown snapshot format")
        data["kind"] = RuntimeKind(data["kind"])
        data["resources"] = Resources(**data["resources"])
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})

    def write(self, dest: Path) -> None:
        (dest / META).write_text(self.to_json())


def check_empty_dir(dest: Path) -> Path:
    """``dest`` must be an existing, empty directory (the caller makes it); returns it made absolute."""
    if not dest.is_dir():
        raise InvalidRequestError(f"snapshot destination {dest} is not a directory")
    if any(dest.iterdir()):
        raise InvalidRequestError(f"snapshot destination {dest} is not empty")
    return dest.absolute()


def clear_dir(dest: Path) -> None:
    """Remove everything inside ``dest`` (not ``dest`` itself): a failed snapshot leaves it empty."""
    trees.clear_dir(dest)


async def copy_tree(src: Path, dst: Path, *, owner: Callable[[int, int], tuple[int, int]] | None = None) -> float:
    """Copy directory ``src`` to ``dst`` (which must not exist) with :func:`warren.trees.copy_tree` in a
    worker thread; return the seconds it took. ``owner(uid, gid) -> (uid, gid)`` gives each copied
    entry its owner from its source's (see :func:`warren.trees.copy_tree`).

    A failure, :data:`COPY_TIMEOUT` or a cancellation of the calling task stops the copy at its next
    entry, and the partial ``dst`` is removed before this returns; failures and the timeout raise
    ``RuntimeFailure``.
    """
    started = time.monotonic()
    cancel = threading.Event()
    work = asyncio.ensure_future(asyncio.to_thread(trees.copy_tree, src, dst, owner=owner, cancel=cancel))
    try:
        await asyncio.wait_for(asyncio.shield(work), COPY_TIMEOUT)
    except BaseException as exc:
        cancel.set()  # the worker stops at its next entry and removes what it made
        with contextlib.suppress(BaseException):
            await work
        if isinstance(exc, TimeoutError):
            raise RuntimeFailure(f"copying {src} to {dst} took longer than {COPY_TIMEOUT:.0f}s") from exc
        if isinstance(exc, OSError | ValueError | trees.TreeLimitExceeded):
            raise RuntimeFailure(f"copying {src} to {dst} failed: {exc}") from exc
        raise
    return time.monotonic() - started


@dataclass(frozen=True)
class RestoreSource:
    """What a restore reads from a snapshot directory (absolute paths)."""

    upper: Path
    image: Path | None
    """The memory image dir, or None: start the agent afresh."""


def open_snapshot(snapshot: Path, *, kind: RuntimeKind, platform: str, agent_bundle: Path) -> RestoreSource:
    """Check that this backend can restore ``snapshot``; return its upper dir and memory image dir.

    Raises ``RuntimeFailure`` when the directory is unusable (no ``upper/``, unreadable ``meta.json``)
    and ``InvalidRequestError`` when its memory image was made by another runtime, runsc platform or
    agent bundle. Without a memory image any backend can start the agent on the snapshot's files.
    """
    snapshot = snapshot.absolute()
    upper = snapshot / UPPER
    if not upper.is_dir():
        raise RuntimeFailure(f"snapshot {snapshot} has no {UPPER}/ directory")
    meta: SnapshotMeta | None = None
    try:
        meta = SnapshotMeta.from_json((snapshot / META).read_text())
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeFailure(f"snapshot {snapshot}: unreadable {META}: {exc}") from exc
    image = snapshot / CHECKPOINT
    has_image = image.is_dir() if meta is None else meta.memory
    if not has_image:
        return RestoreSource(upper, None)
    if not image.is_dir():
        raise RuntimeFailure(f"snapshot {snapshot} has a memory image in {META} but no {CHECKPOINT}/ directory")
    if kind is not RuntimeKind.GVISOR or (meta is not None and meta.kind is not kind):
        raise InvalidRequestError(f"snapshot {snapshot} holds a gVisor memory image; this backend runs {kind}")
    if meta is not None and meta.platform != platform:
        raise InvalidRequestError(
            f"snapshot {snapshot} was checkpointed on runsc platform {meta.platform}; this node uses {platform}")
    if meta is not None and meta.agent_bundle_id != bundle_id(agent_bundle):
        raise InvalidRequestError(
            f"snapshot {snapshot} ran agent bundle {meta.agent_bundle_id}; this node has {bundle_id(agent_bundle)}")
    return RestoreSource(upper, image)


def new_meta(*, kind: RuntimeKind, memory: bool, platform: str | None, binary: Path, version: str | None,
             agent_bundle: Path, resources: Resources, source_id: str, source_state: str) -> SnapshotMeta:
    return SnapshotMeta(
        kind=kind, memory=memory, platform=platform, runtime_binary=os.fspath(binary), runtime_version=version,
        agent_bundle=os.fspath(agent_bundle), agent_bundle_id=bundle_id(agent_bundle), resources=resources,
        source_id=source_id, source_state=source_state, created_at=time.time(),
    )

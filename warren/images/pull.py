"""Pull an image from a registry into a ``LayerStore``.

1. Resolve the reference to a manifest (through an index, picking the configured or host platform).
2. Fetch and verify the image config; it names each layer's diffID and the process defaults.
3. For every layer not yet in the store: download its blob (in parallel, resumable, verified),
   unpack it (in worker threads), check the diffID, rename it into place, drop the blob.

A failed or cancelled pull removes the layers and blobs it created that no other running pull
uses; only resumable downloads under ``partial/`` may remain (never one that failed its digest).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import httpx

from warren.images.blobs import Downloader
from warren.images.config import RegistryConfig
from warren.images.errors import DigestMismatchError, LayerTooLargeError, RegistryError, UnsupportedImageError
from warren.images.manifest import (
    Descriptor,
    Index,
    Manifest,
    host_platform,
    layer_compression,
    parse_image_config,
    parse_manifest,
    select_platform,
)
from warren.images.reference import Reference, parse_reference
from warren.images.registry import RegistryClient
from warren.images.store import LayerStore

MAX_CONFIG_BYTES = 8 << 20
PROGRESS_STEP = 4 << 20
"""Bytes between two ``progress`` events of one download."""
_MAX_INDEX_DEPTH = 2

EventKind = Literal[
    "resolved", "exists", "waiting", "download", "progress", "downloaded", "unpack", "unpacked", "warning", "done"
]


@dataclass(frozen=True)
class ProgressEvent:
    """What a pull is doing. ``digest`` is the manifest digest (resolved/done), the blob digest
    (download/progress/downloaded) or the diffID (exists/waiting/unpack/unpacked)."""

    kind: EventKind
    digest: str
    current: int = 0
    total: int = 0
    message: str = ""
    """``warning``: what the pull log should say (e.g. device nodes a layer had and did not get)."""


@dataclass(frozen=True)
class PulledImage:
    """A pulled image: its layers in the store and the process defaults from its config."""

    reference: str
    """The normalized reference that was pulled (``docker.io/library/busybox:latest``)."""
    digest: str
    """What the reference resolved to: the index digest for a multi-platform image, else the manifest's."""
    manifest_digest: str
    config_digest: str
    layers: tuple[Path, ...]
    """Layer directories, lowest first, each once (a repeated diffID keeps its topmost place): overlay lowerdirs
    are given in the reverse order."""
    diff_ids: tuple[str, ...]
    """Every layer's diffID as the image config lists them, lowest first."""
    env: tuple[str, ...]
    workdir: str
    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    os: str = "linux"
    architecture: str = ""


async def pull(
    ref: str,
    store: LayerStore,
    *,
    config: RegistryConfig,
    progress: Callable[[ProgressEvent], None] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> PulledImage:
    """Pull image ``ref`` into ``store`` and describe it.

    ``transport`` replaces httpx's network transport (tests). Raises ``InvalidRequestError`` (bad
    reference), ``NotFoundError`` (unknown repository, tag or platform), ``RegistryAuthError``,
    ``RegistryError`` (registry unreachable / failing), ``DigestMismatchError``, ``UnsafeLayerError``,
    ``UnsupportedImageError``, ``HostError`` (disk).
    """
    reference = parse_reference(ref)
    emit = progress if progress is not None else _ignore
    async with RegistryClient(config, transport=transport) as client:
        top, manifest_digest, manifest = await _resolve(client, reference, config)
        emit(ProgressEvent("resolved", manifest_digest))
        raw = await client.get_blob(reference, manifest.config.digest, manifest.config.size, MAX_CONFIG_BYTES)
        image = parse_image_config(raw)
        if len(image.diff_ids) != len(manifest.layers):
            raise RegistryError(
                f"{reference}: manifest lists {len(manifest.layers)} layers but the config "
                f"{len(image.diff_ids)} diffIDs"
            )
        for layer, diff_id in zip(manifest.layers, image.diff_ids, strict=True):
            if layer_compression(layer) == "none" and layer.digest != diff_id:
                raise DigestMismatchError(f"uncompressed layer {layer.digest} does not match its diffID {diff_id}")
        await _materialize(client, reference, store, manifest.layers, image.diff_ids, config, emit)
    emit(ProgressEvent("done", manifest_digest))
    topmost = {d: i for i, d in enumerate(image.diff_ids)}
    return PulledImage(
        reference=str(reference),
        digest=top,
        manifest_digest=manifest_digest,
        config_digest=manifest.config.digest,
        layers=tuple(store.layer_path(d) for i, d in enumerate(image.diff_ids) if topmost[d] == i),
        diff_ids=image.diff_ids,
        env=image.env,
        workdir=image.workdir,
        user=image.user,
        entrypoint=image.entrypoint,
        cmd=image.cmd,
        os=image.os,
        architecture=image.architecture,
    )


async def _resolve(client: RegistryClient, ref: Reference, config: RegistryConfig) -> tuple[str, str, Manifest]:
    """``(digest the reference names, platform manifest digest, manifest)``."""
    body, ctype, digest = await client.get_manifest(ref, ref.manifest_ref)
    top = digest
    parsed: Manifest | Index = parse_manifest(body, ctype)
    depth = 0
    while isinstance(parsed, Index):
        depth += 1
        if depth > _MAX_INDEX_DEPTH:
            raise UnsupportedImageError(f"{ref}: image indexes nested deeper than {_MAX_INDEX_DEPTH}")
        os_name, arch = config.platform or host_platform()
        entry = select_platform(parsed, os_name, arch)
        body, ctype, digest = await client.get_manifest(ref, entry.digest)
        parsed = parse_manifest(body, ctype)
    return top, digest, parsed


async def _materialize(
    client: RegistryClient,
    ref: Reference,
    store: LayerStore,
    layers: tuple[Descriptor, ...],
    diff_ids: tuple[str, ...],
    config: RegistryConfig,
    emit: Callable[[ProgressEvent], None],
) -> None:
    downloads = asyncio.Semaphore(config.max_parallel_downloads)
    unpacks = asyncio.Semaphore(config.max_parallel_unpacks)
    unique = dict(zip(diff_ids, layers, strict=True))

    def downloader(desc: Descriptor) -> Downloader:
        async def download(out: BinaryIO) -> None:
            async with downloads:
                emit(ProgressEvent("download", desc.digest, 0, desc.size))
                reported = 0

                def on_bytes(n: int) -> None:
                    nonlocal reported
                    _check_layer_size(desc.digest, n, config.max_layer_bytes)  # what arrived, not what was declared
                    if n - reported >= PROGRESS_STEP:
                        reported = n
                        emit(ProgressEvent("progress", desc.digest, n, desc.size))

                await client.download_blob(ref, desc.digest, desc.size, out, on_bytes)
                emit(ProgressEvent("downloaded", desc.digest, desc.size, desc.size))

        return download

    def on_unpack(diff_id: str) -> Callable[[bool], None]:
        return lambda done: emit(ProgressEvent("unpacked" if done else "unpack", diff_id))

    tasks: list[tuple[str, Descriptor, asyncio.Task[bool]]] = []
    with store.pinned([*unique, *(d.digest for d in unique.values())]):
        try:
            async with asyncio.TaskGroup() as tg:
                for diff_id, desc in unique.items():
                    if store.has_layer(diff_id):
                        emit(ProgressEvent("exists", diff_id))
                        continue
                    _check_layer_size(desc.digest, desc.size, config.max_layer_bytes)  # declared: fail early
                    coro = store.ensure_layer(
                        diff_id,
                        desc.digest,
                        downloader(desc),
                        unpack_slots=unpacks,
                        max_unpacked_bytes=config.max_layer_unpacked_bytes,
                        on_wait=_event(emit, "waiting", diff_id),
                        on_unpack=on_unpack(diff_id),
                        on_warning=_warning(emit, diff_id),
                    )
                    tasks.append((diff_id, desc, tg.create_task(coro, name=f"layer {diff_id[:19]}")))
        except BaseException as exc:
            await _rollback(store, tasks)
            first = _first_error(exc)
            if first is exc:
                raise
            raise first  # noqa: B904 - the group is kept as __context__


async def _rollback(store: LayerStore, tasks: list[tuple[str, Descriptor, asyncio.Task[bool]]]) -> None:
    """Remove what this failed pull created, unless another running pull uses it too."""
    for diff_id, desc, task in tasks:
        created = task.done() and not task.cancelled() and task.exception() is None and task.result()
        if created and store.pin_count(diff_id) == 1:
            await store.discard_layer(diff_id)
        if store.pin_count(desc.digest) == 1:
            store.blobs.remove(desc.digest)


def _check_layer_size(digest: str, size: int, cap: int | None) -> None:
    if cap is not None and size > cap:
        raise LayerTooLargeError(
            f"layer {digest} is larger than this node accepts ({cap} bytes compressed; WARREN_MAX_LAYER_BYTES)"
        )


def _first_error(exc: BaseException) -> BaseException:
    """The error to report for a failed TaskGroup: its first non-cancellation error."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if not isinstance(inner, asyncio.CancelledError):
                return _first_error(inner)
        return asyncio.CancelledError()
    return exc


def _event(emit: Callable[[ProgressEvent], None], kind: EventKind, digest: str) -> Callable[[], None]:
    return lambda: emit(ProgressEvent(kind, digest))


def _warning(emit: Callable[[ProgressEvent], None], diff_id: str) -> Callable[[str], None]:
    return lambda message: emit(ProgressEvent("warning", diff_id, message=message))


def _ignore(_: ProgressEvent) -> None:
    pass


__all__ = ["EventKind", "ProgressEvent", "PulledImage", "pull"]

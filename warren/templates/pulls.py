"""Image pulls for builds and ``POST /images/pull``: registry settings, pull slots, progress lines.

``pull_concurrency`` pulls run at once and the rest queue (never refused). A pulled image's layers
are pinned for the caller (see :class:`warren.templates.layers.Layers`) until it has written the
template that uses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable

from warren.config import Settings
from warren.errors import NotFoundError, WarrenError
from warren.images import (
    Credentials,
    DigestMismatchError,
    LayerStore,
    LayerTooLargeError,
    ProgressEvent,
    PulledImage,
    RegistryAuthError,
    RegistryConfig,
    RegistryError,
    UnsafeLayerError,
    UnsupportedImageError,
    parse_reference,
    pull,
)
from warren.templates.layers import Layers
from warren.templates.model import BASE_STEP, BuildFailed

Say = Callable[[str], None]
"""Where a pull's progress lines go (a build's log, a streamed pull response)."""


class Puller:
    """Pulls images into the node's layer store, ``pull_concurrency`` at a time."""

    def __init__(self, settings: Settings, image_store: LayerStore, layers: Layers) -> None:
        self._settings = settings
        self.image_store = image_store
        self._layers = layers
        self._slots = asyncio.Semaphore(max(1, settings.pull_concurrency))
        self._counts = Counter[str]()
        """``running`` and ``waiting`` pulls."""

    def registry_config(self, image: str | None = None, auth: tuple[str, str] | None = None) -> RegistryConfig:
        s = self._settings
        config = RegistryConfig(
            mirrors=s.registry_mirrors,
            insecure=frozenset(s.insecure_registries),
            max_layer_bytes=s.max_layer_bytes,
            max_layer_unpacked_bytes=s.max_layer_unpacked_bytes,
        )
        if s.registry_auth_file is not None:
            config = config.with_docker_config(s.registry_auth_file)
        if auth is not None and image is not None:
            host = parse_reference(image).registry
            config = dataclasses.replace(config, credentials={**config.credentials, host: Credentials(*auth)})
        return config

    async def pull(
        self,
        ref: str,
        auth: tuple[str, str] | None,
        say: Say,
        pinned: list[str],
        progress: Callable[[ProgressEvent], None] | None = None,
    ) -> PulledImage:
        """Pull ``ref`` and pin its layers in ``pinned``; ``BuildFailed`` (step ``base``) when it fails."""
        started = time.monotonic()

        def on_event(event: ProgressEvent) -> None:
            if progress is not None:
                progress(event)
            line = _progress_line(ref, event)
            if line is not None:
                say(line)

        try:
            async with self._slot(say):
                image = await pull(ref, self.image_store, config=self.registry_config(ref, auth), progress=on_event)
        except WarrenError as exc:
            raise BuildFailed(describe_pull_error(ref, exc), BASE_STEP) from exc
        self._layers.pin([str(p) for p in image.layers], pinned)
        say(f"Pulled {image.reference} ({len(image.layers)} layers) in {time.monotonic() - started:.1f}s")
        return image

    @contextlib.asynccontextmanager
    async def _slot(self, say: Say) -> AsyncIterator[None]:
        if self._slots.locked():
            say("Waiting for another image pull to finish")
        self._counts["waiting"] += 1
        try:
            await self._slots.acquire()
        finally:
            self._counts["waiting"] -= 1
        self._counts["running"] += 1
        try:
            yield
        finally:
            self._counts["running"] -= 1
            self._slots.release()

    def limits(self) -> dict[str, int]:
        """Pulls running and waiting, and the limit (``/health``)."""
        return {"running": self._counts["running"], "waiting": self._counts["waiting"],
                "max": max(1, self._settings.pull_concurrency)}  # fmt: skip


def _progress_line(ref: str, event: ProgressEvent) -> str | None:
    short = event.digest.removeprefix("sha256:")[:12]
    if event.kind == "resolved":
        return f"Resolved {ref} to {event.digest}"
    if event.kind == "exists":
        return f"Layer {short} is stored already"
    if event.kind == "download":
        return f"Downloading layer {short} ({event.total} bytes)"
    if event.kind == "unpacked":
        return f"Unpacked layer {short}"
    if event.kind == "warning":
        return f"Warning: layer {short}: {event.message}"
    return None


def describe_pull_error(ref: str, exc: WarrenError) -> str:
    """A build error message for a failed pull (registry credentials are never our API's 401)."""
    if isinstance(exc, RegistryAuthError):
        return (f"the registry refused access to {ref}: {exc} (set credentials with fromImage username/password "
                f"or the node's WARREN_REGISTRY_AUTH docker config)")  # fmt: skip
    if isinstance(exc, NotFoundError):
        return f"image {ref} not found: {exc}"
    if isinstance(exc, DigestMismatchError):
        return f"image {ref} is corrupt (digest mismatch): {exc}"
    if isinstance(exc, UnsafeLayerError):
        return f"image {ref} has an unsafe layer: {exc}"
    if isinstance(exc, UnsupportedImageError):
        return f"image {ref} is not supported: {exc}"
    if isinstance(exc, LayerTooLargeError):
        return f"image {ref} is too large: {exc}"
    if isinstance(exc, RegistryError):
        return f"cannot pull {ref}: {exc}"
    return f"pulling {ref} failed: {exc}"


__all__ = ["Puller", "Say", "describe_pull_error"]

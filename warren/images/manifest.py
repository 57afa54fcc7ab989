"""Parsing of OCI / Docker schema-2 manifests, image indexes (manifest lists) and image configs."""

from __future__ import annotations

import json
import platform as _platform
import re
from dataclasses import dataclass
from typing import Any, Literal

from warren.errors import NotFoundError
from warren.images.errors import RegistryError, UnsupportedImageError

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})

Compression = Literal["gzip", "none", "zstd"]
LAYER_TYPES: dict[str, Compression] = {
    "application/vnd.oci.image.layer.v1.tar": "none",
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd": "zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
    "application/vnd.docker.image.rootfs.diff.tar": "none",
}
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True)
class Descriptor:
    """A content descriptor: what a manifest says about a blob or a child manifest."""

    media_type: str
    digest: str
    size: int
    os: str | None = None
    architecture: str | None = None
    variant: str | None = None


@dataclass(frozen=True)
class Manifest:
    """An image manifest: one config blob and the layer blobs, lowest layer first."""

    media_type: str
    config: Descriptor
    layers: tuple[Descriptor, ...]


@dataclass(frozen=True)
class Index:
    """An image index / manifest list: one manifest per platform."""

    media_type: str
    manifests: tuple[Descriptor, ...]


@dataclass(frozen=True)
class ImageConfig:
    """What warren uses of an image config: layer diffIDs and the process defaults."""

    diff_ids: tuple[str, ...]
    env: tuple[str, ...]
    workdir: str
    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    os: str
    architecture: str


def host_platform() -> tuple[str, str]:
    """``("linux", <OCI architecture of this machine>)``."""
    machine = _platform.machine().lower()
    return "linux", _ARCH.get(machine, machine)


def parse_manifest(body: bytes, content_type: str) -> Manifest | Index:
    """Parse a manifest or index; the body's ``mediaType`` wins over the Content-Type header."""
    doc = _json_object(body, "manifest")
    if doc.get("schemaVersion") == 1:
        raise UnsupportedImageError(
            "Docker schema-1 manifests are not supported (re-push the image with a current tool)"
        )
    media_type = doc.get("mediaType") or content_type
    if media_type not in INDEX_TYPES and media_type not in MANIFEST_TYPES:
        # An OCI manifest may omit mediaType: tell index from manifest by their fields.
        media_type = OCI_INDEX if "manifests" in doc else OCI_MANIFEST if "layers" in doc else media_type
    if media_type in INDEX_TYPES:
        entries = doc.get("manifests")
        if not isinstance(entries, list):
            raise RegistryError("image index has no 'manifests' list")
        return Index(media_type, tuple(_descriptor(e, "index entry") for e in entries))
    if media_type in MANIFEST_TYPES:
        layers = doc.get("layers")
        if not isinstance(layers, list):
            raise RegistryError("manifest has no 'layers' list")
        config = _descriptor(doc.get("config"), "config")
        if config.media_type not in (OCI_CONFIG, DOCKER_CONFIG):
            raise UnsupportedImageError(f"not a container image (config media type {config.media_type!r})")
        return Manifest(media_type, config, tuple(_descriptor(layer, "layer") for layer in layers))
    raise UnsupportedImageError(f"unsupported manifest media type {media_type!r}")


def select_platform(index: Index, os: str, architecture: str, variant: str | None = None) -> Descriptor:
    """The index entry for ``os/architecture`` (arm64 accepts variant v8 or none); ``NotFoundError`` if none."""
    candidates = [
        d
        for d in index.manifests
        if d.os == os and d.architecture == architecture and d.media_type in (MANIFEST_TYPES | INDEX_TYPES)
    ]
    if variant is not None:
        exact = [d for d in candidates if d.variant == variant]
        candidates = exact or candidates
    elif architecture == "arm64":
        candidates = [d for d in candidates if d.variant in (None, "v8")] or candidates
    if not candidates:
        have = sorted({f"{d.os}/{d.architecture}" + (f"/{d.variant}" if d.variant else "") for d in index.manifests})
        raise NotFoundError(f"the image has no {os}/{architecture} variant (it has: {', '.join(have) or 'none'})")
    return candidates[0]


def layer_compression(layer: Descriptor) -> Compression:
    """How layer ``layer`` is compressed; ``UnsupportedImageError`` for foreign or unknown layer types."""
    kind = LAYER_TYPES.get(layer.media_type)
    if kind is None:
        if "foreign" in layer.media_type or "nondistributable" in layer.media_type:
            raise UnsupportedImageError(f"foreign / non-distributable layer {layer.digest} is not supported")
        raise UnsupportedImageError(f"layer {layer.digest} has unsupported media type {layer.media_type!r}")
    if kind == "zstd":
        raise UnsupportedImageError(
            f"layer {layer.digest} is zstd-compressed; warren supports gzip and uncompressed layers only"
        )
    return kind


def parse_image_config(body: bytes) -> ImageConfig:
    """Parse an image config blob (OCI or Docker; the same JSON)."""
    doc = _json_object(body, "image config")
    rootfs = doc.get("rootfs")
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(diff_ids, list) or not all(isinstance(d, str) and _DIGEST.match(d) for d in diff_ids):
        raise RegistryError("image config has no valid rootfs.diff_ids (sha256 digests)")
    cfg = doc.get("config") or {}
    if not isinstance(cfg, dict):
        raise RegistryError("image config 'config' is not an object")
    return ImageConfig(
        diff_ids=tuple(diff_ids),
        env=_strings(cfg.get("Env"), "Env"),
        workdir=_string(cfg.get("WorkingDir"), "WorkingDir"),
        user=_string(cfg.get("User"), "User"),
        entrypoint=_strings(cfg.get("Entrypoint"), "Entrypoint"),
        cmd=_strings(cfg.get("Cmd"), "Cmd"),
        os=_string(doc.get("os"), "os"),
        architecture=_string(doc.get("architecture"), "architecture"),
    )


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RegistryError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise RegistryError(f"{what} is not a JSON object")
    return doc


def _descriptor(raw: object, what: str) -> Descriptor:
    if not isinstance(raw, dict):
        raise RegistryError(f"{what} descriptor is not an object")
    digest, size, media_type = raw.get("digest"), raw.get("size"), raw.get("mediaType")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        if isinstance(digest, str) and ":" in digest and not digest.startswith("sha256:"):
            raise UnsupportedImageError(f"{what} digest {digest!r}: only sha256 is supported")
        raise RegistryError(f"{what} descriptor has an invalid digest {digest!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise RegistryError(f"{what} descriptor {digest} has an invalid size {size!r}")
    if not isinstance(media_type, str):
        raise RegistryError(f"{what} descriptor {digest} has no mediaType")
    plat = raw.get("platform")
    plat = plat if isinstance(plat, dict) else {}
    return Descriptor(
        media_type=media_type,
        digest=digest,
        size=size,
        os=plat.get("os") if isinstance(plat.get("os"), str) else None,
        architecture=plat.get("architecture") if isinstance(plat.get("architecture"), str) else None,
        variant=plat.get("variant") if isinstance(plat.get("variant"), str) else None,
    )


def _strings(value: object, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RegistryError(f"image config {what} must be a list of strings")
    return tuple(value)


def _string(value: object, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RegistryError(f"image config {what} must be a string")
    return value


__all__ = [
    "Descriptor",
    "ImageConfig",
    "Index",
    "Manifest",
    "host_platform",
    "layer_compression",
    "parse_image_config",
    "parse_manifest",
    "select_platform",
]

"""Fixtures for pull tests: registries (``tests.framework.registry``), the standard test images,
a fresh layer store per test, and overlay mounts that are always unmounted."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.framework.images import Layer, busybox_layer, image_config, layer_from_dir
from tests.framework.registry import PushedImage, Registry, auth_registry, push_image, push_index, registry
from warren.images import LayerStore, RegistryConfig

__all__ = ["StandardImages", "assert_nothing_left", "auth_registry", "contents", "registry"]  # fixtures re-exported


@pytest.fixture(autouse=True)
def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("pull tests create device nodes, trusted.* xattrs and overlay mounts: need root")


@dataclass(frozen=True)
class StandardImages:
    layered: PushedImage
    """busybox + app (files to delete/hide) + whiteouts (.wh. file, opaque dir) + change (data/changed.txt v2)."""
    other: PushedImage
    """busybox + one layer of its own: shares the base layer with ``layered``."""
    multiarch: PushedImage
    amd64: PushedImage
    arm64: PushedImage
    private: PushedImage
    """On the basic-auth registry."""


def _dir_layer(root: Path, files: dict[str, str | None]) -> Layer:
    """A layer from a directory made of ``files`` (path -> text; None makes a directory)."""
    for rel, text in files.items():
        path = root / rel
        if text is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return layer_from_dir(root)


@pytest.fixture(scope="session")
def images(registry: Registry, auth_registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> StandardImages:
    work = tmp_path_factory.mktemp("layers")
    base = busybox_layer()
    app = _dir_layer(
        work / "app",
        {
            "etc/removed.txt": "delete me",
            "opt/opaque/old.txt": "hidden by the opaque dir",
            "opt/opaque/sub/deep.txt": "also hidden",
            "data/changed.txt": "v1",
        },
    )
    whiteouts = _dir_layer(
        work / "whiteouts",
        {"etc/.wh.removed.txt": "", "opt/opaque/.wh..wh..opq": "", "opt/opaque/new.txt": "new"},
    )
    change = _dir_layer(work / "change", {"data/changed.txt": "v2"})
    layers = [base, app, whiteouts, change]
    config = image_config(layers, env=("PATH=/bin", "APP=1"), cmd=("run",), entrypoint=("/bin/sh", "-c"),
                          workdir="/data", user="1000:1000")  # fmt: skip
    layered = push_image(registry, "test/layered", "latest", layers, config)
    other = push_image(registry, "test/other", "v1", [base, _dir_layer(work / "other", {"etc/other.txt": "o"})])
    arch_layers = [base, _dir_layer(work / "arch", {"etc/arch-image": "yes"})]
    amd64 = push_image(registry, "test/multi", None, arch_layers, image_config(arch_layers, env=("ARCH=amd64",)))
    arm64 = push_image(
        registry, "test/multi", None, arch_layers, image_config(arch_layers, arch="arm64", env=("ARCH=arm64",))
    )
    multiarch = push_index(registry, "test/multi", "latest", {"amd64": amd64, "arm64": arm64})
    private = push_image(auth_registry, "test/private", "latest", [base])
    return StandardImages(layered, other, multiarch, amd64, arm64, private)


@pytest.fixture
def store(tmp_path: Path) -> LayerStore:
    return LayerStore(tmp_path / "store")


@pytest.fixture
def config() -> RegistryConfig:
    return RegistryConfig(retries=1)


def contents(store: LayerStore) -> dict[str, list[str]]:
    """Everything in the store, by area."""
    return {
        "layers": sorted(p.name for p in store.layers_dir.iterdir()),
        "blobs": sorted(p.name for p in store.blobs.blobs.iterdir()),
        "partial": sorted(p.name for p in store.blobs.partial.iterdir()),
        "tmp": sorted(p.name for p in store.tmp.iterdir()),
    }


def assert_nothing_left(store: LayerStore, registry: Registry, never_partial: Collection[str] = ()) -> None:
    """No layer, blob or temp file; partial downloads only as true prefixes of their blobs."""
    got = contents(store)
    assert (got["layers"], got["blobs"], got["tmp"]) == ([], [], []), got
    for name in got["partial"]:
        assert f"sha256:{name}" not in never_partial
        data = (store.blobs.partial / name).read_bytes()
        assert registry.blob_file(f"sha256:{name}").read_bytes().startswith(data)


@pytest.fixture
def overlay(tmp_path: Path) -> Iterator[Callable[[tuple[Path, ...]], Path]]:
    """``overlay(layers)`` mounts the layers (lowest first) read-only and returns the mount point."""
    mounted: list[Path] = []

    def mount(layers: tuple[Path, ...]) -> Path:
        target = tmp_path / f"merged{len(mounted)}"
        target.mkdir()
        lower = ":".join(str(p) for p in reversed(layers))
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower}", str(target)], check=True)
        mounted.append(target)
        return target

    yield mount
    for target in reversed(mounted):
        subprocess.run(["umount", str(target)], check=True)

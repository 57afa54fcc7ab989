"""Pulls from a real registry (Debian's docker-registry on 127.0.0.1) into a real layer store."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import platform
import tarfile
from asyncio.subprocess import PIPE
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.framework.images import busybox_layer, make_layer, member
from tests.framework.registry import TEST_USER, Registry, free_port, push_image, push_large_image
from tests.integration.images.conftest import StandardImages, assert_nothing_left, contents
from warren.errors import AuthenticationError, HostError, NotFoundError
from warren.images import (
    OPAQUE_XATTR,
    DigestMismatchError,
    LayerStore,
    ProgressEvent,
    RegistryAuthError,
    RegistryConfig,
    RegistryError,
    UnsafeLayerError,
    pull,
)

pytestmark = [pytest.mark.registry, pytest.mark.root]
HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


async def test_layered_image_whiteouts_opaque_dirs_and_overlay(
    images: StandardImages, store: LayerStore, config: RegistryConfig, overlay: Callable[[tuple[Path, ...]], Path]
) -> None:
    image = await pull(images.layered.ref, store, config=config)
    assert image.reference == images.layered.ref and image.digest == images.layered.digest
    assert image.manifest_digest == image.digest and image.config_digest == images.layered.config_digest
    assert image.diff_ids == tuple(x.diff_id for x in images.layered.layers)
    assert image.layers == tuple(store.layer_path(d) for d in image.diff_ids)
    assert (image.env, image.cmd, image.entrypoint) == (("PATH=/bin", "APP=1"), ("run",), ("/bin/sh", "-c"))
    assert (image.workdir, image.user, image.os, image.architecture) == ("/data", "1000:1000", "linux", "amd64")

    _base, app, whiteouts, _change = image.layers
    gone = (whiteouts / "etc/removed.txt").lstat()
    assert gone.st_rdev == os.makedev(0, 0) and (gone.st_mode & 0o170000) == 0o020000  # char device 0/0
    assert os.getxattr(whiteouts / "opt/opaque", OPAQUE_XATTR) == b"y"
    assert (app / "etc/removed.txt").read_text() == "delete me"

    merged = overlay(image.layers)
    assert not (merged / "etc/removed.txt").exists()
    assert sorted(p.name for p in (merged / "opt/opaque").iterdir()) == ["new.txt"]
    assert (merged / "data/changed.txt").read_text() == "v2"
    assert (merged / "bin/busybox").is_file()
    proc = await asyncio.create_subprocess_exec(
        "chroot", str(merged), "/bin/sh", "-c", "cat /data/changed.txt; echo; ls /opt/opaque", stdout=PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0 and out.split() == [b"v2", b"new.txt"]


async def test_images_sharing_a_base_store_it_once(
    images: StandardImages, registry: Registry, store: LayerStore, config: RegistryConfig
) -> None:
    mark = registry.mark()
    first = await pull(images.layered.ref, store, config=config)
    events: list[ProgressEvent] = []
    second = await pull(images.other.ref, store, config=config, progress=events.append)
    base = busybox_layer()
    assert first.layers[0] == second.layers[0] == store.layer_path(base.diff_id)
    assert len(contents(store)["layers"]) == 5  # busybox + 3 + 1
    assert len(registry.blob_gets(base.digest, since=mark)) == 1
    assert ("exists", base.diff_id) in [(e.kind, e.digest) for e in events]
    assert [e.digest for e in events if e.kind == "download"] == [images.other.layers[1].digest]
    assert contents(store)["blobs"] == contents(store)["partial"] == contents(store)["tmp"] == []


async def test_concurrent_pulls_share_one_download_per_blob(
    images: StandardImages, registry: Registry, store: LayerStore, config: RegistryConfig
) -> None:
    mark = registry.mark()
    events: list[ProgressEvent] = []
    results = await asyncio.gather(*(pull(images.layered.ref, store, config=config, progress=events.append)
                                     for _ in range(3)))  # fmt: skip
    assert len({r.layers for r in results}) == 1
    for layer in images.layered.layers:
        assert len(registry.blob_gets(layer.digest, since=mark)) == 1, layer.digest
    downloads = Counter(e.digest for e in events if e.kind == "download")
    assert downloads == Counter({layer.digest: 1 for layer in images.layered.layers})
    assert len(contents(store)["layers"]) == 4


async def test_multiarch_index_picks_the_host_platform(
    images: StandardImages, store: LayerStore, config: RegistryConfig
) -> None:
    image = await pull(images.multiarch.ref, store, config=config)
    expected = images.amd64 if HOST_ARCH == "amd64" else images.arm64
    assert image.digest == images.multiarch.digest and image.manifest_digest == expected.digest
    assert image.env == (f"ARCH={HOST_ARCH}",) and image.architecture == HOST_ARCH

    arm = await pull(images.multiarch.ref, store, config=RegistryConfig(platform=("linux", "arm64")))
    assert arm.manifest_digest == images.arm64.digest and arm.env == ("ARCH=arm64",)
    assert arm.layers == image.layers  # same layers, different config
    with pytest.raises(NotFoundError, match="linux/s390x"):
        await pull(images.multiarch.ref, store, config=RegistryConfig(platform=("linux", "s390x")))


async def test_pull_by_digest(images: StandardImages, registry: Registry, store: LayerStore) -> None:
    ref = f"{registry.host}/test/other@{images.other.digest}"
    image = await pull(ref, store, config=RegistryConfig())
    assert image.reference == ref and image.digest == images.other.digest


async def test_basic_auth_with_docker_config(
    images: StandardImages, auth_registry: Registry, store: LayerStore, tmp_path: Path
) -> None:
    with pytest.raises(RegistryAuthError, match=r"\(401\)") as info:
        await pull(images.private.ref, store, config=RegistryConfig())
    assert isinstance(info.value, AuthenticationError)
    docker_config = tmp_path / "config.json"
    docker_config.write_text(json.dumps({"auths": {auth_registry.host: {"auth": base64.b64encode(
        ":".join(TEST_USER).encode()).decode()}}}))  # fmt: skip
    image = await pull(images.private.ref, store, config=RegistryConfig().with_docker_config(docker_config))
    assert image.layers[0] == store.layer_path(busybox_layer().diff_id)

    docker_config.write_text(json.dumps({"auths": {auth_registry.host: {"username": TEST_USER[0], "password": "x"}}}))
    wrong = RegistryConfig().with_docker_config(docker_config)
    with pytest.raises(RegistryAuthError, match="refused"):
        await pull(images.private.ref, LayerStore(tmp_path / "s2"), config=wrong)


@pytest.mark.parametrize("ref", ["test/does-not-exist:latest", "test/layered:no-such-tag"])
async def test_unknown_image_or_tag(
    ref: str, images: StandardImages, registry: Registry, store: LayerStore, config: RegistryConfig
) -> None:
    with pytest.raises(NotFoundError, match="not found"):
        await pull(f"{registry.host}/{ref}", store, config=config)
    assert_nothing_left(store, registry)


async def test_registry_down(store: LayerStore, config: RegistryConfig, registry: Registry) -> None:
    with pytest.raises(RegistryError, match="cannot reach registry") as info:
        await pull(f"127.0.0.1:{free_port()}/test/x:latest", store, config=config)
    assert isinstance(info.value, HostError)
    assert_nothing_left(store, registry)


async def test_corrupted_blob_is_refused_and_nothing_is_left(
    registry: Registry, store: LayerStore, config: RegistryConfig
) -> None:
    """The registry serves a tampered blob: its stored file is edited on disk (same length)."""
    unique = make_layer([member("payload", os.urandom(200_000))])
    image = push_image(registry, "test/tampered", "latest", [busybox_layer(), unique])
    blob_file = registry.blob_file(unique.digest)
    data = bytearray(blob_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob_file.write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError, match=unique.digest):
        await pull(image.ref, store, config=config)
    assert_nothing_left(store, registry, never_partial={unique.digest})


def _unsafe_members(kind: str, outside: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    if kind == "dotdot":
        return [member("etc", kind=tarfile.DIRTYPE, mode=0o755), member("etc/../../escape", b"x")]
    assert kind == "symlink-parent"
    return [member("evil", kind=tarfile.SYMTYPE, linkname=str(outside)), member("evil/pwned", b"x")]


@pytest.mark.parametrize("kind", ["dotdot", "symlink-parent"])
async def test_unsafe_layer_is_refused_and_nothing_is_left(
    kind: str, registry: Registry, store: LayerStore, config: RegistryConfig, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    bad = make_layer(_unsafe_members(kind, outside))
    image = push_image(registry, f"test/unsafe-{kind}", "latest", [busybox_layer(), bad])
    with pytest.raises(UnsafeLayerError):
        await pull(image.ref, store, config=config)
    assert_nothing_left(store, registry)
    assert list(outside.iterdir()) == [] and not (store.root / "escape").exists()


async def test_device_nodes_are_dropped_with_a_warning(
    registry: Registry, store: LayerStore, config: RegistryConfig
) -> None:
    """A debootstrap-made image: its /dev nodes are not created, the pull says so, the image is usable."""
    console, null = member("dev/console", kind=tarfile.CHRTYPE, mode=0o600), member("dev/null", kind=tarfile.CHRTYPE)
    console[0].devmajor, console[0].devminor, null[0].devmajor, null[0].devminor = 5, 1, 1, 3
    with_dev = make_layer([member("dev", kind=tarfile.DIRTYPE, mode=0o755), console, null, member("etc/os", b"deb")])
    image = push_image(registry, "test/debootstrap-dev", "latest", [busybox_layer(), with_dev])
    events: list[ProgressEvent] = []
    pulled = await pull(image.ref, store, config=config, progress=events.append)
    top = pulled.layers[-1]
    assert (top / "etc/os").read_bytes() == b"deb" and list((top / "dev").iterdir()) == []
    [warning] = [e for e in events if e.kind == "warning"]
    assert warning.digest == with_dev.diff_id
    assert "2 device nodes not created" in warning.message and "dev/console, dev/null" in warning.message
    again: list[ProgressEvent] = []
    await pull(image.ref, store, config=config, progress=again.append)
    assert [e.kind for e in again if e.kind == "warning"] == [], "a stored layer is not unpacked (or reported) again"


async def test_resumes_a_partial_download_with_range(
    images: StandardImages, registry: Registry, store: LayerStore, config: RegistryConfig
) -> None:
    base = busybox_layer()
    half = base.size // 2
    (store.blobs.partial / base.digest.removeprefix("sha256:")).write_bytes(base.blob[:half])
    mark = registry.mark()
    image = await pull(images.other.ref, store, config=config)
    [get] = registry.blob_gets(base.digest, since=mark)
    assert (get.status, get.size) == (206, base.size - half)
    assert (image.layers[0] / "bin/busybox").is_file() and contents(store)["partial"] == []


async def test_cancelled_pull_leaves_nothing_but_resumable_partials(
    registry: Registry, store: LayerStore, config: RegistryConfig
) -> None:
    image = push_large_image(registry, "test/cancel", total_bytes=48 << 20, layers=2)
    started = asyncio.Event()

    def progress(event: ProgressEvent) -> None:
        if event.kind == "progress":
            started.set()

    task = asyncio.ensure_future(pull(image.ref, store, config=config, progress=progress))
    await asyncio.wait_for(started.wait(), 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert_nothing_left(store, registry)
    assert contents(store)["partial"]  # the interrupted downloads stay resumable


async def test_mirrors(images: StandardImages, registry: Registry, store: LayerStore) -> None:
    mirrored = RegistryConfig(mirrors={"mirror-test.invalid": (registry.url,)})
    image = await pull("mirror-test.invalid/test/other:v1", store, config=mirrored)
    assert image.digest == images.other.digest and image.reference == "mirror-test.invalid/test/other:v1"
    dead_first = RegistryConfig(mirrors={registry.host: (f"http://127.0.0.1:{free_port()}",)})
    assert (await pull(images.layered.ref, store, config=dead_first)).digest == images.layered.digest


async def test_gc_removes_only_unreferenced(images: StandardImages, store: LayerStore, config: RegistryConfig) -> None:
    layered = await pull(images.layered.ref, store, config=config)
    other = await pull(images.other.ref, store, config=config)
    stray_blob = store.blobs.blobs / ("ab" * 32)
    stray_blob.write_bytes(b"left by a crash")
    stray_partial = store.blobs.partial / ("cd" * 32)
    stray_partial.write_bytes(b"half")
    removed = store.gc(set(layered.diff_ids))
    assert sorted(removed) == sorted([f"layers/{other.diff_ids[1][7:]}", f"blobs/sha256/{'ab' * 32}",
                                      f"partial/sha256/{'cd' * 32}"])  # fmt: skip
    assert all(p.is_dir() for p in layered.layers) and not other.layers[1].exists()
    assert store.layer_ids() == sorted(layered.diff_ids)

    with store.pinned([layered.diff_ids[0]]):  # a running pull's layers survive
        assert len(store.gc(set())) == 3
        assert store.layer_ids() == [layered.diff_ids[0]]
    assert store.gc(set()) == [f"layers/{layered.diff_ids[0][7:]}"]
    assert contents(store) == {"layers": [], "blobs": [], "partial": [], "tmp": []}


async def test_large_image_helper(registry: Registry, store: LayerStore, config: RegistryConfig) -> None:
    image = push_large_image(registry, "test/large", total_bytes=8 << 20, layers=2)
    pulled = await pull(image.ref, store, config=config)
    sizes = [sum(f.stat().st_size for f in (layer / "data").rglob("*.bin")) for layer in pulled.layers[1:]]
    assert sizes == [4 << 20, 4 << 20]
    assert all(layer.size > 4 << 20 for layer in image.layers[1:])  # incompressible

"""Manifest, index and image-config parsing; platform selection."""

from __future__ import annotations

import json

import pytest

from warren.errors import NotFoundError
from warren.images.errors import RegistryError, UnsupportedImageError
from warren.images.manifest import (
    DOCKER_MANIFEST,
    OCI_INDEX,
    Index,
    Manifest,
    layer_compression,
    parse_image_config,
    parse_manifest,
    select_platform,
)

D = ["sha256:" + c * 64 for c in "0123456789abcdef"]


def _manifest(
    media: str = DOCKER_MANIFEST, layer_type: str = "application/vnd.docker.image.rootfs.diff.tar.gzip"
) -> bytes:
    cfg_type = "application/vnd.docker.container.image.v1+json"
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": media,
            "config": {"mediaType": cfg_type, "digest": D[0], "size": 10},
            "layers": [{"mediaType": layer_type, "digest": D[1], "size": 100}],
        }
    ).encode()


def _index(*platforms: tuple[str, str, str | None]) -> Index:
    entries = []
    for i, (os_name, arch, variant) in enumerate(platforms):
        plat = {"os": os_name, "architecture": arch, **({"variant": variant} if variant else {})}
        entries.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": D[i], "size": 1,
                        "platform": plat})  # fmt: skip
    parsed = parse_manifest(json.dumps({"schemaVersion": 2, "manifests": entries}).encode(), OCI_INDEX)
    assert isinstance(parsed, Index)
    return parsed


def test_docker_manifest() -> None:
    m = parse_manifest(_manifest(), "")
    assert isinstance(m, Manifest)
    assert m.config.digest == D[0]
    assert [(x.digest, x.size) for x in m.layers] == [(D[1], 100)]
    assert layer_compression(m.layers[0]) == "gzip"


def test_oci_manifest_without_media_type_field() -> None:
    doc = json.loads(_manifest())
    del doc["mediaType"]
    doc["config"]["mediaType"] = "application/vnd.oci.image.config.v1+json"
    assert isinstance(parse_manifest(json.dumps(doc).encode(), "application/octet-stream"), Manifest)


def test_select_platform() -> None:
    index = _index(
        ("linux", "amd64", None), ("linux", "arm", "v7"), ("linux", "arm64", "v8"), ("unknown", "unknown", None)
    )
    assert select_platform(index, "linux", "amd64").digest == D[0]
    assert select_platform(index, "linux", "arm64").digest == D[2]
    assert select_platform(index, "linux", "arm", "v7").digest == D[1]
    with pytest.raises(NotFoundError, match="linux/amd64, linux/arm/v7, linux/arm64/v8"):
        select_platform(index, "linux", "s390x")


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b'{"schemaVersion": 1, "fsLayers": []}', UnsupportedImageError),
        (b"[]", RegistryError),
        (b"not json", RegistryError),
        (json.dumps({"schemaVersion": 2, "mediaType": "application/x-other"}).encode(), UnsupportedImageError),
    ],
)
def test_bad_manifests(body: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_manifest(body, "")


def test_bad_descriptors() -> None:
    doc = json.loads(_manifest())
    doc["layers"][0]["digest"] = "sha512:" + "a" * 128
    with pytest.raises(UnsupportedImageError, match="sha256"):
        parse_manifest(json.dumps(doc).encode(), "")
    doc["layers"][0]["digest"] = "sha256:xyz"
    with pytest.raises(RegistryError, match="invalid digest"):
        parse_manifest(json.dumps(doc).encode(), "")
    doc["layers"][0] = {"mediaType": "x", "digest": D[1], "size": -1}
    with pytest.raises(RegistryError, match="size"):
        parse_manifest(json.dumps(doc).encode(), "")


@pytest.mark.parametrize(
    ("layer_type", "match"),
    [
        ("application/vnd.oci.image.layer.v1.tar+zstd", "zstd"),
        ("application/vnd.docker.image.rootfs.foreign.diff.tar.gzip", "foreign"),
        ("application/vnd.example.thing", "unsupported media type"),
    ],
)
def test_unsupported_layers(layer_type: str, match: str) -> None:
    m = parse_manifest(_manifest(layer_type=layer_type), "")
    assert isinstance(m, Manifest)
    with pytest.raises(UnsupportedImageError, match=match):
        layer_compression(m.layers[0])


def test_non_image_config_type_is_refused() -> None:
    doc = json.loads(_manifest())
    doc["config"]["mediaType"] = "application/vnd.cncf.helm.config.v1+json"
    with pytest.raises(UnsupportedImageError, match="not a container image"):
        parse_manifest(json.dumps(doc).encode(), "")


def test_image_config() -> None:
    body = json.dumps(
        {
            "architecture": "arm64",
            "os": "linux",
            "config": {"Env": ["A=1"], "WorkingDir": "/w", "User": "1000:1000", "Entrypoint": ["/e"], "Cmd": None},
            "rootfs": {"type": "layers", "diff_ids": [D[3], D[4]]},
        }
    ).encode()
    cfg = parse_image_config(body)
    assert (cfg.env, cfg.workdir, cfg.user, cfg.entrypoint, cfg.cmd) == (("A=1",), "/w", "1000:1000", ("/e",), ())
    assert cfg.diff_ids == (D[3], D[4])
    assert cfg.architecture == "arm64"
    with pytest.raises(RegistryError, match="diff_ids"):
        parse_image_config(b'{"rootfs": {"diff_ids": ["nope"]}}')
    with pytest.raises(RegistryError, match="Env"):
        parse_image_config(json.dumps({"rootfs": {"diff_ids": []}, "config": {"Env": "A=1"}}).encode())

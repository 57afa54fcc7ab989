"""Image reference parsing: Docker Hub defaults, tags, digests, registry hosts with ports."""

from __future__ import annotations

import pytest

from warren.errors import InvalidRequestError
from warren.images.reference import Reference, normalize_registry, parse_reference

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest"),
    [
        ("busybox", "docker.io", "library/busybox", "latest", None),
        ("busybox:1.36", "docker.io", "library/busybox", "1.36", None),
        ("library/busybox", "docker.io", "library/busybox", "latest", None),
        ("docker.io/busybox", "docker.io", "library/busybox", "latest", None),
        ("index.docker.io/library/busybox:musl", "docker.io", "library/busybox", "musl", None),
        ("registry-1.docker.io/user/app", "docker.io", "user/app", "latest", None),
        ("user/app:v1.2.3-rc_1", "docker.io", "user/app", "v1.2.3-rc_1", None),
        ("ghcr.io/owner/repo/sub:tag", "ghcr.io", "owner/repo/sub", "tag", None),
        ("localhost/x", "localhost", "x", "latest", None),
        ("localhost:5000/x/y:z", "localhost:5000", "x/y", "z", None),
        ("127.0.0.1:5000/app", "127.0.0.1:5000", "app", "latest", None),
        ("[::1]:5000/app:1", "[::1]:5000", "app", "1", None),
        ("Registry.Example.com:443/a.b/c__d/e-f", "registry.example.com:443", "a.b/c__d/e-f", "latest", None),
        (f"busybox@{DIGEST}", "docker.io", "library/busybox", None, DIGEST),
        (f"quay.io/a/b:1.0@{DIGEST}", "quay.io", "a/b", "1.0", DIGEST),
        (f"localhost:5000/a@{DIGEST}", "localhost:5000", "a", None, DIGEST),
    ],
)
def test_parse(text: str, registry: str, repository: str, tag: str | None, digest: str | None) -> None:
    ref = parse_reference(text)
    assert ref == Reference(registry, repository, tag, digest)


def test_port_without_dot_is_registry_but_user_namespace_is_not() -> None:
    assert parse_reference("myhost:5000/app").registry == "myhost:5000"
    assert parse_reference("myuser/app").registry == "docker.io"
    assert parse_reference("myuser/app").repository == "myuser/app"


def test_str_and_api_host() -> None:
    ref = parse_reference("busybox")
    assert str(ref) == "docker.io/library/busybox:latest"
    assert ref.api_host == "registry-1.docker.io"
    assert ref.manifest_ref == "latest"
    pinned = parse_reference(f"localhost:5000/a:t@{DIGEST}")
    assert str(pinned) == f"localhost:5000/a:t@{DIGEST}"
    assert pinned.api_host == "localhost:5000"
    assert pinned.manifest_ref == DIGEST  # the digest wins over the tag


@pytest.mark.parametrize(
    "text",
    [
        "",
        "  ",
        "Busybox",  # uppercase repository
        "busybox:",  # empty tag
        "busybox:-bad",
        "busybox:" + "t" * 129,
        "busybox@sha256:abc",
        "busybox@md5:" + "ab" * 16,
        "a//b",
        "host:5000/",
        "-bad.example.com/x",
        "x/../y",
        "a" * 300,
    ],
)
def test_invalid(text: str) -> None:
    with pytest.raises(InvalidRequestError):
        parse_reference(text)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("https://index.docker.io/v1/", "docker.io"),
        ("registry-1.docker.io", "docker.io"),
        ("http://127.0.0.1:5000", "127.0.0.1:5000"),
        ("GHCR.io", "ghcr.io"),
    ],
)
def test_normalize_registry(host: str, expected: str) -> None:
    assert normalize_registry(host) == expected

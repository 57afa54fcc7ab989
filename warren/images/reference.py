"""Image references: ``[registry[:port]/]repository[:tag][@digest]``, normalized like Docker does.

    busybox                      -> docker.io/library/busybox:latest
    user/app:1.2                 -> docker.io/user/app:1.2
    ghcr.io/o/r@sha256:<hex>     -> ghcr.io/o/r@sha256:<hex>
    localhost:5000/x             -> localhost:5000/x:latest

The first path component is a registry host only if it contains ``.`` or ``:``, or is ``localhost``
(Docker's rule); otherwise the reference is on Docker Hub, and a one-component Hub repository gets
the ``library/`` prefix. ``index.docker.io`` and ``registry-1.docker.io`` are spelled ``docker.io``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from warren.errors import InvalidRequestError

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
"""Where Docker Hub's registry API actually lives."""

_HUB_ALIASES = frozenset({DOCKER_HUB, "index.docker.io", DOCKER_HUB_API})
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(rf"^(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:.]+\])(?::[0-9]{{1,5}})?$")
_PATH_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_MAX_NAME = 255


@dataclass(frozen=True)
class Reference:
    """A parsed, normalized image reference. ``tag`` is None only when pulling by ``digest``."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def api_host(self) -> str:
        """Host[:port] of the registry API (Docker Hub's is not ``docker.io``)."""
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def manifest_ref(self) -> str:
        """What to ask ``/v2/<repo>/manifests/<ref>`` for: the digest if pinned, else the tag."""
        if self.digest is not None:
            return self.digest
        assert self.tag is not None
        return self.tag

    @property
    def name(self) -> str:
        """``registry/repository`` without tag or digest."""
        return f"{self.registry}/{self.repository}"

    def __str__(self) -> str:
        out = self.name
        if self.tag is not None:
            out += f":{self.tag}"
        if self.digest is not None:
            out += f"@{self.digest}"
        return out


def normalize_registry(host: str) -> str:
    """The canonical spelling of a registry host (Docker Hub's aliases become ``docker.io``)."""
    host = host.strip().lower()
    for prefix in ("https://", "http://"):
        if host.startswith(prefix):
            host = host[len(prefix) :]
    host = host.split("/", 1)[0]
    return DOCKER_HUB if host in _HUB_ALIASES else host


def parse_reference(text: str) -> Reference:
    """Parse and normalize ``text``; raise ``InvalidRequestError`` naming what is wrong with it."""
    raw = text.strip()
    if not raw:
        raise InvalidRequestError("empty image reference")
    rest, digest = raw, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.match(digest):
            raise InvalidRequestError(f"image reference {text!r}: digest must be sha256:<64 hex digits>")
    tag = None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest, tag = rest.rsplit(":", 1)
        if not _TAG.match(tag):
            raise InvalidRequestError(f"image reference {text!r}: invalid tag {tag!r}")
    registry, _, path = rest.partition("/")
    if not path or not ("." in registry or ":" in registry or registry == "localhost" or registry.startswith("[")):
        registry, path = DOCKER_HUB, rest
    else:
        if not _DOMAIN.match(registry):
            raise InvalidRequestError(f"image reference {text!r}: invalid registry host {registry!r}")
        registry = normalize_registry(registry)
    components = path.split("/")
    for comp in components:
        if not _PATH_COMPONENT.match(comp):
            raise InvalidRequestError(
                f"image reference {text!r}: invalid repository component {comp!r} "
                "(lowercase letters, digits and single separators . _ __ - only)"
            )
    if registry == DOCKER_HUB and len(components) == 1:
        path = f"library/{path}"
    if len(registry) + 1 + len(path) > _MAX_NAME:
        raise InvalidRequestError(f"image reference {text!r}: name longer than {_MAX_NAME} characters")
    if tag is None and digest is None:
        tag = "latest"
    return Reference(registry=registry, repository=path, tag=tag, digest=digest)


__all__ = ["DOCKER_HUB", "DOCKER_HUB_API", "Reference", "normalize_registry", "parse_reference"]

"""A real OCI registry for tests (Debian's ``docker-registry``) and images pushed to it.

``running_registry(workdir)`` starts ``docker-registry serve`` on a free 127.0.0.1 port with
filesystem storage under ``workdir`` (optionally behind htpasswd basic auth) and stops it on exit;
``registry`` / ``auth_registry`` are session fixtures around it. ``push_image`` / ``push_index``
push layers built with ``tests.framework.images`` through the registry API (monolithic POST+PUT
uploads); ``push_large_image`` pushes a benchmark-sized image of incompressible data.

The registry's access log (``Registry.requests()``) lets tests count what was fetched, and
``Registry.blob_file()`` points at a stored blob so a test can tamper with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import tarfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.framework.images import (
    OCI_CONFIG,
    OCI_INDEX,
    OCI_MANIFEST,
    Layer,
    busybox_layer,
    image_config,
    make_layer,
    member,
    sha256,
)

__all__ = [
    "REGISTRY_BIN",
    "TEST_USER",
    "AccessLine",
    "PushedImage",
    "Registry",
    "auth_registry",
    "bcrypt_hash",
    "push_blob",
    "push_image",
    "push_index",
    "push_large_image",
    "push_manifest",
    "registry",
    "running_registry",
]

REGISTRY_BIN = Path("/usr/bin/docker-registry")
TEST_USER = ("warren-test", "s3cret-pass")
_ACCESS = re.compile(r'"(?P<method>[A-Z]+) (?P<uri>\S+) HTTP/[0-9.]+" (?P<status>\d{3}) (?P<size>\d+|-)')
_START_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class AccessLine:
    method: str
    uri: str
    status: int
    size: int


@dataclass
class Registry:
    """A running test registry."""

    host: str
    storage: Path
    log_path: Path
    credentials: tuple[str, str] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def client(self) -> httpx.Client:
        """A sync client for pushing, authenticated if the registry wants it."""
        return httpx.Client(base_url=self.url, auth=self.credentials, timeout=120)

    def blob_file(self, digest: str) -> Path:
        """Where the registry's filesystem driver keeps blob ``digest``."""
        hexd = digest.removeprefix("sha256:")
        return self.storage / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"

    def mark(self) -> int:
        """How many requests the access log holds now: pass it as ``since`` to count only later ones."""
        return len(self.requests())

    def requests(self, method: str | None = None, contains: str = "", since: int = 0) -> list[AccessLine]:
        """Access-log lines so far (waits briefly for the log to settle: it is written after the response)."""
        previous = -1
        for _ in range(20):
            size = self.log_path.stat().st_size
            if size == previous:
                break
            previous = size
            time.sleep(0.05)
        lines = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if m := _ACCESS.search(line):
                size = 0 if m["size"] == "-" else int(m["size"])
                lines.append(AccessLine(m["method"], m["uri"], int(m["status"]), size))
        return [x for x in lines[since:] if (method is None or x.method == method) and contains in x.uri]

    def blob_gets(self, digest: str, since: int = 0) -> list[AccessLine]:
        """Successful GETs of blob ``digest`` (after request number ``since``)."""
        return [r for r in self.requests("GET", f"/blobs/{digest}", since) if r.status in (200, 206)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bcrypt_hash(password: str) -> str:
    """A bcrypt hash for an htpasswd file (the registry accepts nothing else).

    Python 3.11's ``crypt`` does bcrypt through libcrypt; ``htpasswd -B`` (apache2-utils) is the fallback.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import crypt

            hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))
            if hashed and hashed.startswith("$2"):
                return hashed
        except ImportError:
            pass
    if shutil.which("htpasswd"):
        out = subprocess.run(["htpasswd", "-nbBC", "4", "u", password], check=True, capture_output=True, text=True)
        return out.stdout.strip().split(":", 1)[1]
    raise RuntimeError("no bcrypt available (python crypt module or htpasswd from apache2-utils)")


@contextlib.contextmanager
def running_registry(workdir: Path, *, credentials: tuple[str, str] | None = None) -> Iterator[Registry]:
    """Run ``docker-registry`` with storage under ``workdir`` until the block exits."""
    workdir.mkdir(parents=True, exist_ok=True)
    storage = workdir / "storage"
    port = free_port()
    auth = ""
    if credentials is not None:
        htpasswd = workdir / "htpasswd"
        htpasswd.write_text(f"{credentials[0]}:{bcrypt_hash(credentials[1])}\n")
        auth = f"auth:\n  htpasswd:\n    realm: warren-test\n    path: {htpasswd}\n"
    config = workdir / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: info\n  formatter: text\n  accesslog:\n    disabled: false\n"
        f"storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n"
        "  maintenance:\n    uploadpurging:\n      enabled: false\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: {secrets.token_hex(16)}\n" + auth
    )
    log_path = workdir / "registry.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [str(REGISTRY_BIN), "serve", str(config)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    reg = Registry(host=f"127.0.0.1:{port}", storage=storage, log_path=log_path, credentials=credentials)
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{reg.url}/v2/", timeout=1).status_code in (200, 401):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"docker-registry did not come up:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.05)
        yield reg
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _need_registry() -> None:
    if not REGISTRY_BIN.is_file():
        pytest.skip("needs Debian's docker-registry (apt install docker-registry)")


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """An anonymous registry shared by the session."""
    _need_registry()
    with running_registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry behind htpasswd basic auth; ``credentials`` holds its one user."""
    _need_registry()
    with running_registry(tmp_path_factory.mktemp("auth-registry"), credentials=TEST_USER) as reg:
        yield reg


@dataclass(frozen=True)
class PushedImage:
    ref: str
    """``127.0.0.1:<port>/<repo>:<tag>``"""
    digest: str
    """The manifest's digest (the index's for ``push_index``)."""
    config_digest: str
    layers: tuple[Layer, ...]


def push_blob(client: httpx.Client, repo: str, data: bytes) -> str:
    """Upload ``data`` unless the registry has it already (monolithic POST + PUT); its digest."""
    digest = sha256(data)
    if client.head(f"/v2/{repo}/blobs/{digest}").status_code == 200:
        return digest
    started = client.post(f"/v2/{repo}/blobs/uploads/")
    assert started.status_code == 202, started.text
    location = httpx.URL(started.headers["location"])
    url = client.base_url.join(location) if not location.is_absolute_url else location
    done = client.put(
        url.copy_merge_params({"digest": digest}), content=data, headers={"Content-Type": "application/octet-stream"}
    )
    assert done.status_code == 201, done.text
    return digest


def push_manifest(client: httpx.Client, repo: str, ref: str, body: bytes, media_type: str) -> str:
    resp = client.put(f"/v2/{repo}/manifests/{ref}", content=body, headers={"Content-Type": media_type})
    assert resp.status_code == 201, resp.text
    return sha256(body)


def push_image(
    reg: Registry, repo: str, tag: str | None, layers: list[Layer], config: bytes | None = None
) -> PushedImage:
    """Push an OCI image (blobs, config, manifest); ``tag=None`` pushes the manifest by digest only."""
    config = config if config is not None else image_config(layers)
    with reg.client() as client:
        for layer in layers:
            push_blob(client, repo, layer.blob)
        config_digest = push_blob(client, repo, config)
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": len(config)},
            "layers": [{"mediaType": x.media_type, "digest": x.digest, "size": x.size} for x in layers],
        }
        body = json.dumps(manifest).encode()
        digest = push_manifest(client, repo, tag or sha256(body), body, OCI_MANIFEST)
    return PushedImage(f"{reg.host}/{repo}:{tag}" if tag else f"{reg.host}/{repo}@{digest}", digest, config_digest,
                       tuple(layers))  # fmt: skip


def push_index(reg: Registry, repo: str, tag: str, images: dict[str, PushedImage]) -> PushedImage:
    """Push an OCI index over already pushed manifests, keyed by architecture (``amd64``, ``arm64``)."""
    entries = []
    with reg.client() as client:
        for arch, image in images.items():
            body = client.get(f"/v2/{repo}/manifests/{image.digest}", headers={"Accept": OCI_MANIFEST}).content
            platform = {"os": "linux", "architecture": arch, **({"variant": "v8"} if arch == "arm64" else {})}
            entries.append({"mediaType": OCI_MANIFEST, "digest": image.digest, "size": len(body), "platform": platform})
        body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
        digest = push_manifest(client, repo, tag, body, OCI_INDEX)
    return PushedImage(f"{reg.host}/{repo}:{tag}", digest, "", ())


def push_large_image(
    reg: Registry, repo: str, tag: str = "latest", *, total_bytes: int = 300 << 20, layers: int = 6
) -> PushedImage:
    """A busybox image plus ``layers`` layers of random (incompressible) files, ``total_bytes`` in all.

    Fresh random data on every call, so a pull never finds these layers already stored. About
    ten seconds for 300 MB (gzip level 1), most of it compressing.
    """
    per_layer = total_bytes // layers
    built = [busybox_layer()]
    for i in range(layers):
        files = [member(f"data/layer{i}", kind=tarfile.DIRTYPE, mode=0o755)]
        chunk = per_layer // 4
        files += [member(f"data/layer{i}/blob{j}.bin", os.urandom(chunk)) for j in range(4)]
        built.append(make_layer([member("data", kind=tarfile.DIRTYPE, mode=0o755), *files], level=1))
    return push_image(reg, repo, tag, built)

"""Issue 9's smaller hardening items, each against a real node.

- Import roots: ``POST /warren/templates/import`` takes only directories under ``WARREN_IMPORT_ROOTS``
  (default: the cache dir), after resolving ``..`` and symlinks; anything else is 403.
- The data-plane proxy builds its upstream URL from parts: no request target reaches a host port.
- An asterisk-form target and a JSON integer past Python's digit limit are 400s, not 500s.
- Snapshot and template names of reserved forms are 400.
- Runtime records need their class's assets, with file/http(s)/s3 URLs.
- ``/health`` without the API key says only ``status``.
- Device nodes in image layers are dropped with a warning in the pull log, not refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.framework.images import image_config, layer_from_dir, make_layer, member
from tests.framework.node import DEFAULT_CACHE, Node, running_node
from tests.framework.registry import Registry, push_image, registry

__all__ = ["registry"]  # the session fixture, used below

BUSYBOX = DEFAULT_CACHE / "templates" / "busybox" / "rootfs"


def _json_error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == status and isinstance(body["message"], str) and body["message"]
    return str(body["message"])


# --- import roots ------------------------------------------------------------------------------


@dataclass
class RootsNode:
    node: Node
    root_a: Path
    root_b: Path
    outside: Path


@pytest.fixture(scope="module")
def roots_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RootsNode]:
    """A node whose import roots are two temp dirs; a busybox rootfs inside and one outside them."""
    if os.geteuid() != 0 or not BUSYBOX.is_dir():
        pytest.skip("needs root and the built-in templates (scripts/setup.sh)")
    base = tmp_path_factory.mktemp("roots")
    root_a, root_b, outside = base / "a", base / "b", base / "outside"
    for d in (root_a, root_b, outside):
        d.mkdir()
    shutil.copytree(BUSYBOX, root_a / "bb", symlinks=True)
    shutil.copytree(BUSYBOX, root_b / "bb", symlinks=True)
    shutil.copytree(BUSYBOX, outside / "bb", symlinks=True)
    env = {"WARREN_IMPORT_ROOTS": f"{root_a}:{root_b}"}
    with running_node(base / "state", extra_env=env) as node:
        yield RootsNode(node, root_a, root_b, outside)


def _import(node: Node, path: Path | str, name: str) -> httpx.Response:
    with node.client() as c:
        return c.post("/warren/templates/import", json={"path": str(path), "name": name})


def test_import_from_each_root_works(roots_node: RootsNode) -> None:
    assert _import(roots_node.node, roots_node.root_a / "bb", "in-a").status_code == 201
    assert _import(roots_node.node, roots_node.root_b / "bb", "in-b").status_code == 201


def test_import_outside_the_roots_is_403_naming_the_setting(roots_node: RootsNode) -> None:
    message = _json_error(_import(roots_node.node, roots_node.outside / "bb", "out"), 403)
    assert "WARREN_IMPORT_ROOTS" in message
    with roots_node.node.client() as c:
        assert c.get("/templates/out").status_code == 404


def test_the_host_root_is_403(roots_node: RootsNode) -> None:
    assert "WARREN_IMPORT_ROOTS" in _json_error(_import(roots_node.node, "/", "host"), 403)


def test_dotdot_escape_is_403(roots_node: RootsNode) -> None:
    path = f"{roots_node.root_a}/../outside/bb"
    _json_error(_import(roots_node.node, path, "dotdot"), 403)
    _json_error(_import(roots_node.node, f"{roots_node.root_a}/../../../../../../", "dotdot2"), 403)


def test_symlink_escape_is_403(roots_node: RootsNode) -> None:
    link = roots_node.root_a / "link"
    link.symlink_to(roots_node.outside / "bb")
    _json_error(_import(roots_node.node, link, "link"), 403)


def test_template_dir_whose_rootfs_points_outside_is_403(roots_node: RootsNode) -> None:
    tpl = roots_node.root_b / "tpl"
    tpl.mkdir()
    (tpl / "template.json").write_text("{}")
    (tpl / "rootfs").symlink_to(roots_node.outside / "bb")
    _json_error(_import(roots_node.node, tpl, "tpl"), 403)


def test_missing_path_outside_the_roots_is_403_not_404(roots_node: RootsNode) -> None:
    """Outside the roots nothing is looked at: the answer does not tell whether a host path exists."""
    _json_error(_import(roots_node.node, "/nonexistent/dir", "gone"), 403)


def test_cache_dir_imports_and_host_root_does_not(node: Node) -> None:
    """The session node (roots: the cache dir and pytest's temp dir): the conftest imported from the
    cache dir; the host's root is refused, also when reached through ``..``."""
    with node.client() as c:
        assert c.get("/templates/base-gvisor").status_code == 200
    assert "WARREN_IMPORT_ROOTS" in _json_error(_import(node, "/", "host-root"), 403)
    _json_error(_import(node, f"{DEFAULT_CACHE}/templates/../../../..", "host-root2"), 403)


# --- raw HTTP ----------------------------------------------------------------------------------


def _raw(node: Node, request_line: str, headers: dict[str, str] | None = None, body: bytes = b"") -> tuple[int, bytes]:
    """Send one request exactly as written (no client normalises the target); (status, body)."""
    head = [request_line, "Host: 127.0.0.1", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body:
        head.append(f"Content-Length: {len(body)}")
    with socket.create_connection(("127.0.0.1", node.port), timeout=60) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    _, _, payload = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), payload


class HostListener:
    """A TCP server on a host port that records every connection it gets (it must get none)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.hits: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    self.hits.append(conn.recv(4096))
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\nHOST-REACHED")
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()
        self._thread.join(timeout=10)


@pytest.fixture
def listener() -> Iterator[HostListener]:
    srv = HostListener()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture(scope="module")
def sandbox(node: Node) -> Iterator[tuple[str, str]]:
    """One running runc sandbox for the proxy and snapshot checks: (id, envd access token)."""
    with node.client() as c:
        r = c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 600})
        assert r.status_code == 201, r.text
        sid, token = str(r.json()["sandboxID"]), str(r.json()["envdAccessToken"])
    try:
        yield sid, token
    finally:
        with node.client() as c:
            c.delete(f"/sandboxes/{sid}")


@pytest.fixture
def sandbox_id(sandbox: tuple[str, str]) -> str:
    return sandbox[0]


# --- proxy upstream URL ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    ["@127.0.0.1:{port}/x", "//127.0.0.1:{port}/x", "http://127.0.0.1:{port}/x", ":{port}@127.0.0.1:{port}/x"],
)
def test_request_target_never_changes_the_upstream_host(
    node: Node, sandbox: tuple[str, str], listener: HostListener, target: str
) -> None:
    """400 from the node, or the agent's own 404 for a path it does not serve: never the host port."""
    headers = {"E2b-Sandbox-Id": sandbox[0], "E2b-Sandbox-Port": "49983", "X-Access-Token": sandbox[1]}
    status, body = _raw(node, f"GET {target.format(port=listener.port)} HTTP/1.1", headers)
    assert b"HOST-REACHED" not in body
    assert listener.hits == [], "the proxy connected to a host port"
    assert status in (400, 404), (status, body)


def test_proxy_still_reaches_the_sandbox(node: Node, sandbox_id: str) -> None:
    """The control for the test above: a normal target through the same raw path is answered by the agent."""
    status, _ = _raw(node, "GET /health HTTP/1.1", {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"})
    assert status == 204


# --- asterisk-form target, huge integers ---------------------------------------------------------


@pytest.mark.parametrize("method", ["OPTIONS", "GET"])
@pytest.mark.parametrize("to_sandbox", [False, True])
def test_asterisk_target_is_a_400_json_error(node: Node, sandbox_id: str, method: str, to_sandbox: bool) -> None:
    headers = {"X-API-Key": node.api_key}
    if to_sandbox:
        headers["E2b-Sandbox-Id"] = sandbox_id
    status, body = _raw(node, f"{method} * HTTP/1.1", headers)
    assert status == 400, body
    assert json.loads(body)["code"] == 400


@pytest.mark.parametrize(
    "body",
    [
        b'{"templateID": "base", "timeout": ' + b"1" * 5000 + b"}",
        b'{"templateID": "base", "metadata": ' + b"[" * 100000 + b"]" * 100000 + b"}",
    ],
    ids=["5000-digit-integer", "nested-100000-deep"],
)
def test_json_body_python_cannot_hold_is_400(node: Node, body: bytes) -> None:
    with node.client() as c:
        r = c.post("/v2/sandboxes", content=body, headers={"content-type": "application/json"})
        assert "JSON" in _json_error(r, 400)
        assert c.get("/v2/sandboxes").status_code == 200


# --- reserved names ----------------------------------------------------------------------------

BAD_NAMES = ["template:tabc", "TEMPLATE:x", "a/b", "x:y:z", ":tag", "name:", "", "x" * 129, "sabcdefghij012345678"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_reserved_snapshot_names_are_400(node: Node, sandbox_id: str, name: str) -> None:
    with node.client() as c:
        _json_error(c.post(f"/sandboxes/{sandbox_id}/snapshots", json={"name": name}), 400)
        assert all(name not in s["names"] for s in c.get("/snapshots").json())


@pytest.mark.parametrize("name", BAD_NAMES)
def test_reserved_template_names_are_400(node: Node, name: str) -> None:
    src = str(DEFAULT_CACHE / "templates" / "busybox" / "rootfs")
    with node.client() as c:
        _json_error(c.post("/v3/templates", json={"name": name}), 400)
        _json_error(c.post("/warren/templates/import", json={"path": src, "name": name}), 400)


def test_valid_name_with_tag_is_accepted_for_a_snapshot(node: Node, sandbox_id: str) -> None:
    with node.client() as c:
        r = c.post(f"/sandboxes/{sandbox_id}/snapshots", json={"name": "my-snap_1.0:v2"})
        assert r.status_code == 201, r.text
        assert c.delete(f"/snapshots/{r.json()['snapshotID']}").status_code == 204


# --- runtime records ---------------------------------------------------------------------------

H = "0" * 64


@pytest.mark.parametrize(
    ("record", "needle"),
    [
        ({"sandbox_class": "runc", "assets": {}}, "runc"),
        ({"sandbox_class": "gvisor"}, "runsc"),
        ({"sandbox_class": "runc", "assets": {"runsc": {"url": "file:///usr/bin/runsc", "sha256": H}}}, "runc"),
        ({"sandbox_class": "gvisor", "assets": {"runsc": {"url": "ftp://mirror/runsc", "sha256": H}}}, "ftp"),
        ({"sandbox_class": "gvisor", "assets": {"runsc": {"url": "runsc", "sha256": H}}}, "runsc"),
        ({"sandbox_class": "gvisor", "assets": {"runsc": {"url": "file:runsc", "sha256": H}}}, "absolute"),
        ({"sandbox_class": "gvisor", "assets": {"runsc": {"url": "file://host/runsc", "sha256": H}}}, "file"),
        ({"sandbox_class": "gvisor", "assets": {"runsc": {"url": "https:///runsc", "sha256": H}}}, "host"),
        ({"sandbox_class": "runc", "assets": {"runc": {"url": "s3://", "sha256": H}}}, "bucket"),
    ],
)
def test_runtime_record_without_usable_assets_is_400(node: Node, record: dict[str, object], needle: str) -> None:
    with node.client() as c:
        before = c.get("/runtimes").json()
        assert needle in _json_error(c.post("/warren/runtimes", json=record), 400)
        assert c.get("/runtimes").json() == before


def test_runtime_record_with_its_binary_is_registered(node: Node) -> None:
    runc = Path(shutil.which("runc") or "/usr/sbin/runc").resolve()
    digest = hashlib.sha256(runc.read_bytes()).hexdigest()
    record = {"sandbox_class": "runc", "assets": {"runc": {"url": runc.as_uri(), "sha256": digest}}}
    with node.client() as c:
        r = c.post("/warren/runtimes", json=record)
        assert r.status_code == 201, r.text
        s3 = {"sandbox_class": "gvisor", "assets": {"runsc": {"url": "s3://bucket/gvisor/runsc", "sha256": H}}}
        assert c.post("/warren/runtimes", json=s3).status_code == 201


# --- /health -----------------------------------------------------------------------------------


def test_health_without_a_key_says_only_status(node: Node) -> None:
    for headers in ({}, {"X-API-Key": "wrong"}):
        r = httpx.get(f"{node.url}/health", headers=headers)
        assert r.status_code == 200
        assert r.json() == {"status": "ok"}


def test_health_with_the_key_has_the_details(node: Node) -> None:
    with node.client() as c:
        body = c.get("/health").json()
    assert body["status"] == "ok"
    assert {"runtimes", "warmPool", "sandboxes", "agent_bundle"} <= body.keys()


# --- device nodes in image layers --------------------------------------------------------------


def test_image_with_device_nodes_pulls_with_a_warning(node: Node, registry: Registry) -> None:
    console, null = member("dev/console", kind=tarfile.CHRTYPE, mode=0o600), member("dev/null", kind=tarfile.CHRTYPE)
    console[0].devmajor, console[0].devminor, null[0].devmajor, null[0].devminor = 5, 1, 1, 3
    dev = make_layer([member("dev", kind=tarfile.DIRTYPE, mode=0o755), console, null, member("etc/deb", b"yes\n")])
    base = layer_from_dir(BUSYBOX)
    env = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    image = push_image(registry, "warren-test/with-dev", "v1", [base, dev], config=image_config([base, dev], env=env))
    with node.client() as c:
        r = c.post("/warren/images/pull", json={"image": image.ref, "name": "with-dev"}, timeout=300)
        assert r.status_code == 200, r.text
        events = [json.loads(line) for line in r.text.splitlines()]
        try:
            assert events[-1]["event"] == "template", events[-1]
            [warning] = [e for e in events if e["event"] == "warning"]
            assert warning["digest"] == dev.diff_id
            assert "2 device nodes not created" in warning["message"] and "dev/console" in warning["message"]
            logged = [e["message"] for e in events if e["event"] == "log"]
            assert any(m.startswith("Warning: layer ") and "dev/console" in m for m in logged), logged
            box = c.post("/v2/sandboxes", json={"templateID": "with-dev"})
            assert box.status_code == 201, box.text
            c.delete(f"/sandboxes/{box.json()['sandboxID']}")
        finally:
            c.delete("/templates/with-dev")

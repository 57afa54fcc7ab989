"""Node caps against real nodes: sandboxes (429), concurrent pulls (queued), layer and upload sizes
(error / 413), template cpu/memory bounds (400), and the HTTP server's header timeout and
concurrency limit (503).

Each node is started with small caps through its ``WARREN_*`` environment. The pull-concurrency
test puts a counting HTTP relay between the node and a real registry (Debian's ``docker-registry``):
the relay is the independent observer that counts how many pulls are in flight at once.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import RateLimitException

from tests.framework.images import Layer, image_config, make_layer, member
from tests.framework.node import DEFAULT_CACHE, Node, running_node
from tests.framework.registry import Registry, push_image, registry

__all__ = ["registry"]  # the session registry fixture, used below

TEMPLATE = "busybox"
UPLOAD_CAP = 64 << 10
LAYER_CAP = 256 << 10
UNPACKED_CAP = 1 << 20


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("these tests start real nodes and sandboxes and need root")
    if not (DEFAULT_CACHE / "templates" / "busybox" / "rootfs").is_dir():
        pytest.skip(f"no built-in templates in {DEFAULT_CACHE}: run `warren setup` first")


def _json_error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == status and isinstance(body["message"], str) and body["message"], body
    return str(body["message"])


def _wait_for(what: str, check: Any, timeout: float = 60.0) -> Any:
    """Poll ``check()`` until it returns something truthy (bounded); the value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _sandbox_dirs(node: Node) -> set[str]:
    root = node.state_dir / "sandboxes"
    return {p.name for p in root.iterdir()} if root.is_dir() else set()


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """Two sandboxes, 64 KiB uploads, cpu 1..4, memory 128..2048 MiB, 16 HTTP connections."""
    _need_root()
    env = {
        "WARREN_MAX_SANDBOXES": "2",
        "WARREN_MAX_UPLOAD_BYTES": str(UPLOAD_CAP),
        "WARREN_MAX_CPU": "4",
        "WARREN_MAX_MEMORY_MB": "2048",
        "WARREN_HTTP_MAX_CONCURRENCY": "16",
        "WARREN_HTTP_HEADER_TIMEOUT_S": "120",
    }
    with running_node(tmp_path_factory.mktemp("capped") / "state", extra_env=env) as node:
        yield node


# --------------------------------------------------------------------------- sandboxes


def _create(c: httpx.Client, template: str = TEMPLATE) -> httpx.Response:
    return c.post("/v2/sandboxes", json={"templateID": template, "timeout": 300})


def test_sandbox_cap_refuses_create_with_e2b_429(capped: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in capped.env().items():
        monkeypatch.setenv(key, value)
    with capped.client() as c:
        first, second = _create(c), _create(c)
        assert first.status_code == 201 and second.status_code == 201, (first.text, second.text)
        before = _sandbox_dirs(capped)
        message = _json_error(_create(c), 429)
        assert "maximum number of concurrent" in message and "(2)" in message and "WARREN_MAX_SANDBOXES" in message
        assert len(c.get("/v2/sandboxes").json()) == 2
        assert _sandbox_dirs(capped) == before  # nothing half-created
        # The unmodified SDK maps it to its RateLimitException, as against E2B.
        with pytest.raises(RateLimitException, match="maximum number of concurrent"):
            Sandbox.create(template=TEMPLATE)
        assert _sandbox_dirs(capped) == before
        c.delete(f"/sandboxes/{first.json()['sandboxID']}")
        third = _create(c)
        assert third.status_code == 201, third.text
    capped.kill_all_sandboxes()


def test_sandbox_cap_counts_resume_and_fork_not_paused(capped: Node) -> None:
    """Paused sandboxes hold no slot; resuming one takes a slot again (429 when none is free); a fork
    over the cap is refused before anything is snapshotted."""
    with capped.client() as c:
        paused = _create(c).json()["sandboxID"]
        assert c.post(f"/sandboxes/{paused}/pause").status_code == 204
        a = _create(c)
        b = _create(c)
        assert a.status_code == 201 and b.status_code == 201, (a.text, b.text)  # the paused one does not count
        message = _json_error(c.post(f"/sandboxes/{paused}/connect", json={"timeout": 60}), 429)
        assert "maximum number of concurrent" in message
        assert c.get(f"/sandboxes/{paused}").json()["state"] == "paused"
        before = _sandbox_dirs(capped)
        assert "maximum number of concurrent" in _json_error(
            c.post(f"/sandboxes/{a.json()['sandboxID']}/fork", json={"count": 1}), 429
        )
        assert _sandbox_dirs(capped) == before
        assert not list((capped.state_dir / "snapshots").glob("**/fork-*"))
        assert c.delete(f"/sandboxes/{b.json()['sandboxID']}").status_code == 204
        resumed = c.post(f"/sandboxes/{paused}/connect", json={"timeout": 60})
        assert resumed.status_code == 201, resumed.text
        assert _json_error(_create(c), 429)
    capped.kill_all_sandboxes()


def test_auto_resume_over_the_cap_is_429_through_the_proxy(capped: Node) -> None:
    """Traffic to a paused auto-resume sandbox on a full node: 429 from the proxy, the sandbox stays paused."""
    with capped.client() as c:
        body = {"templateID": TEMPLATE, "timeout": 300, "autoPause": True, "autoResume": True}
        sleeper = c.post("/v2/sandboxes", json=body).json()["sandboxID"]
        assert c.post(f"/sandboxes/{sleeper}/pause").status_code == 204
        assert _create(c).status_code == 201 and _create(c).status_code == 201
        headers = {"E2b-Sandbox-Id": sleeper, "E2b-Sandbox-Port": "49983"}
        message = _json_error(httpx.get(f"{capped.url}/health", headers=headers, timeout=60), 429)
        assert "maximum number of concurrent" in message
        assert c.get(f"/sandboxes/{sleeper}").json()["state"] == "paused"
    capped.kill_all_sandboxes()


def test_warm_pool_never_blocks_creates_and_stops_refilling_at_the_cap(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    _need_root()
    env = {"WARREN_MAX_SANDBOXES": "2", "WARREN_WARM_POOL": "2"}
    with running_node(tmp_path_factory.mktemp("pool-cap") / "state", extra_env=env) as node, node.client() as c:

        def limits() -> dict[str, int]:
            return dict(c.get("/health").json()["limits"]["sandboxes"])

        first = _create(c)
        assert first.status_code == 201, first.text
        def ready() -> int:
            return sum(s["ready"] for s in c.get("/health").json()["warmPool"].values())

        # The pool wants 2 spares of busybox but refills only up to the cap: 1 user + 1 spare.
        _wait_for("one warm spare", lambda: ready() == 1 and limits()["spares"] == 1)
        assert limits()["active"] == 1 and len(_sandbox_dirs(node)) <= 2
        # A create of another template finds no spare of its own: it gets the slot the spare held.
        other = _create(c, "base")
        assert other.status_code == 201, other.text
        assert limits() == {**limits(), "active": 2, "spares": 0}
        _json_error(_create(c), 429)
        assert len(_sandbox_dirs(node)) <= 2
        # A freed slot is refilled by the pool, and a create of that template claims the spare.
        c.delete(f"/sandboxes/{other.json()['sandboxID']}")
        _wait_for("the pool to refill the freed slot", lambda: ready() == 1)
        hits = sum(s["hits"] for s in c.get("/health").json()["warmPool"].values())
        claimed = _create(c)
        assert claimed.status_code == 201, claimed.text
        assert sum(s["hits"] for s in c.get("/health").json()["warmPool"].values()) == hits + 1
        assert limits()["active"] == 2 and len(_sandbox_dirs(node)) <= 2


# --------------------------------------------------------------------------- uploads and template bounds


def _reserve_build(c: httpx.Client, name: str, **resources: int) -> httpx.Response:
    return c.post("/v3/templates", json={"name": name, **resources})


def test_upload_over_the_cap_is_413_and_leaves_no_file(capped: Node) -> None:
    files_hash = "ab" * 32
    uploads = capped.state_dir / "uploads"
    with capped.client() as c:
        template_id = _reserve_build(c, "upload-cap").json()["templateID"]
        url = f"/warren/uploads/{template_id}/{files_hash}"
        message = _json_error(c.put(url, content=os.urandom(UPLOAD_CAP + 1)), 413)
        assert str(UPLOAD_CAP) in message and "WARREN_MAX_UPLOAD_BYTES" in message

        def chunked() -> Iterator[bytes]:  # no Content-Length: the node has to count what arrives
            for _ in range(4):
                yield os.urandom(UPLOAD_CAP // 2)

        _json_error(c.put(url, content=chunked()), 413)
        assert not (uploads / f"{files_hash}.tar").exists()
        assert list((uploads / "tmp").iterdir()) == []
        ok = c.put(url, content=os.urandom(UPLOAD_CAP))
        assert ok.status_code == 201 and ok.json()["size"] == UPLOAD_CAP, ok.text


@pytest.mark.parametrize(
    ("resources", "names"),
    [
        ({"cpuCount": 0}, "CPU count must be at least 1"),
        ({"cpuCount": 5}, "CPU count can't be higher than 4"),
        ({"memoryMB": 64}, "Memory must be at least 128 MiB"),
        ({"memoryMB": 4096}, "Memory can't be higher than 2048 MiB"),
    ],
)
def test_template_resources_outside_the_bounds_are_400(capped: Node, resources: dict[str, int], names: str) -> None:
    with capped.client() as c:
        message = _json_error(_reserve_build(c, "bounds", **resources), 400)
    assert names in message


def test_template_resources_within_the_bounds_are_accepted(capped: Node) -> None:
    with capped.client() as c:
        r = _reserve_build(c, "bounds-ok", cpuCount=4, memoryMB=2048)
    assert r.status_code == 202, r.text


# --------------------------------------------------------------------------- HTTP server


def _partial_request(node: Node, data: bytes = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", node.port))
    s.sendall(data)
    return s


def _closed_by_peer(s: socket.socket) -> bool:
    s.settimeout(0.05)
    try:
        return s.recv(4096) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_concurrency_limit_answers_503(capped: Node) -> None:
    held = [_partial_request(capped) for _ in range(16)]
    try:
        r = httpx.get(f"{capped.url}/health", timeout=30)
        _json_error(r, 503)
    finally:
        for s in held:
            s.close()
    _wait_for("the node to serve again", lambda: httpx.get(f"{capped.url}/health", timeout=30).status_code == 200)


@pytest.fixture(scope="module")
def quick_headers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A 2-second header timeout; pulls at most 2 at once; small layer caps."""
    _need_root()
    env = {
        "WARREN_HTTP_HEADER_TIMEOUT_S": "2",
        "WARREN_PULL_CONCURRENCY": "2",
        "WARREN_MAX_LAYER_BYTES": str(LAYER_CAP),
        "WARREN_MAX_LAYER_UNPACKED_BYTES": str(UNPACKED_CAP),
    }
    with running_node(tmp_path_factory.mktemp("quick") / "state", extra_env=env) as node:
        yield node


def test_slow_loris_connections_are_closed_and_others_are_served(quick_headers: Node) -> None:
    node = quick_headers
    slow = [_partial_request(node) for _ in range(30)]
    slow.append(_partial_request(node, b""))  # connected, never sends a byte
    # A connection that finished one request and then trickles the next one is no different.
    again = socket.create_connection(("127.0.0.1", node.port))
    again.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert again.recv(65536).startswith(b"HTTP/1.1 200")
    again.sendall(b"GET /health HTTP/1.1\r\n")
    slow.append(again)
    try:
        assert httpx.get(f"{node.url}/health", timeout=30).status_code == 200
        open_ = list(slow)
        deadline = time.monotonic() + 60
        while open_ and time.monotonic() < deadline:
            open_ = [s for s in open_ if not _closed_by_peer(s)]
        assert not open_, f"{len(open_)} slow connections still open"
        assert httpx.get(f"{node.url}/health", timeout=30).status_code == 200
    finally:
        for s in slow:
            s.close()


# --------------------------------------------------------------------------- pulls and layers


def _pull(node: Node, image: str, name: str) -> list[dict[str, Any]]:
    with node.client() as c:
        r = c.post("/warren/images/pull", json={"image": image, "name": name}, timeout=300)
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines()]


def _random_layer(size: int, name: str = "data.bin") -> Layer:
    return make_layer([member(name, os.urandom(size))], level=1)


def _assert_no_layer_left(node: Node, layer: Layer) -> None:
    images = node.state_dir / "images"
    hex_diff, hex_blob = layer.diff_id.removeprefix("sha256:"), layer.digest.removeprefix("sha256:")
    assert not (images / "layers" / hex_diff).exists()
    assert not (images / "blobs" / "sha256" / hex_blob).exists()
    assert not (images / "partial" / "sha256" / hex_blob).exists()
    assert [p.name for p in (images / "tmp").iterdir()] == []


def test_layer_over_the_compressed_cap_fails_the_pull_and_leaves_nothing(
    quick_headers: Node, registry: Registry
) -> None:
    big = _random_layer(LAYER_CAP + (64 << 10))
    image = push_image(registry, "warren-test/limit-big", "v1", [big], config=image_config([big]))
    events = _pull(quick_headers, image.ref, "limit-big")
    assert events[-1]["event"] == "error", events[-1]
    assert "WARREN_MAX_LAYER_BYTES" in events[-1]["message"] and str(LAYER_CAP) in events[-1]["message"]
    _assert_no_layer_left(quick_headers, big)
    with quick_headers.client() as c:
        assert c.get("/templates/limit-big").status_code == 404


def test_layer_over_the_unpacked_cap_fails_the_pull_and_leaves_nothing(quick_headers: Node, registry: Registry) -> None:
    bomb = make_layer([member("zeros.bin", bytes(4 * UNPACKED_CAP))], level=9)
    assert bomb.size < LAYER_CAP
    image = push_image(registry, "warren-test/limit-bomb", "v1", [bomb], config=image_config([bomb]))
    events = _pull(quick_headers, image.ref, "limit-bomb")
    assert events[-1]["event"] == "error", events[-1]
    assert "WARREN_MAX_LAYER_UNPACKED_BYTES" in events[-1]["message"] and str(UNPACKED_CAP) in events[-1]["message"]
    _assert_no_layer_left(quick_headers, bomb)


class _Relay(http.server.ThreadingHTTPServer):
    """Forwards registry reads; holds layer-blob responses until ``release`` is set; counts pulls.

    A pull is *active* from its first manifest request until its layer blob has been sent.
    """

    daemon_threads = True

    def __init__(self, upstream: str, layers: set[str]) -> None:
        super().__init__(("127.0.0.1", 0), _RelayHandler)
        self.upstream = upstream
        self.layers = layers
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.active: set[str] = set()
        self.started: list[str] = []
        self.held = 0
        self.max_active = 0

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _RelayHandler(http.server.BaseHTTPRequestHandler):
    server: _Relay

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._relay()

    def do_GET(self) -> None:
        self._relay()

    def _relay(self) -> None:
        relay = self.server
        parts = self.path.split("/")
        repo = "/".join(parts[2:-2]) if len(parts) > 4 else ""
        is_layer = "/blobs/" in self.path and parts[-1] in relay.layers
        if "/manifests/" in self.path:
            with relay.lock:
                if repo not in relay.active and repo not in relay.started:
                    relay.started.append(repo)
                relay.active.add(repo)
                relay.max_active = max(relay.max_active, len(relay.active))
        if is_layer:
            with relay.lock:
                relay.held += 1
            relay.release.wait(120)
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("accept", "range", "authorization")}
        with httpx.Client(base_url=relay.upstream, timeout=60) as client:
            r = client.request(self.command, self.path, headers=headers)
        self.send_response(r.status_code)
        for key, value in r.headers.items():
            if key.lower() not in ("transfer-encoding", "connection", "content-length", "content-encoding"):
                self.send_header(key, value)
        body = r.content if self.command == "GET" else b""
        self.send_header(
            "Content-Length", str(len(body) if self.command == "GET" else r.headers.get("content-length", 0))
        )
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        if is_layer:
            with relay.lock:
                relay.active.discard(repo)


@contextlib.contextmanager
def _relay(upstream: str, layers: set[str]) -> Iterator[_Relay]:
    server = _Relay(upstream, layers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()


def test_pulls_beyond_the_concurrency_limit_wait_their_turn(quick_headers: Node, registry: Registry) -> None:
    node = quick_headers
    layers = [_random_layer(16 << 10, f"f{i}") for i in range(3)]
    refs = []
    for i, layer in enumerate(layers):
        pushed = push_image(registry, f"warren-test/conc-{i}", "v1", [layer], config=image_config([layer]))
        refs.append(pushed.ref.split("/", 1)[1])
    with _relay(registry.url, {x.digest for x in layers}) as relay:
        results: dict[int, list[dict[str, Any]]] = {}

        def pull(i: int) -> None:
            results[i] = _pull(node, f"{relay.host}/{refs[i]}", f"conc-{i}")

        threads = [threading.Thread(target=pull, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        try:

            def queued() -> bool:
                with node.client() as c:
                    pulls = c.get("/health").json()["limits"]["pulls"]
                return bool(relay.held == 2 and pulls == {**pulls, "running": 2, "waiting": 1, "max": 2})

            _wait_for("two pulls held at the registry and one queued", queued)
            assert len(relay.started) == 2  # the third has not asked the registry for anything
        finally:
            relay.release.set()
            for t in threads:
                t.join(300)
    assert all(results[i][-1]["event"] == "template" for i in range(3)), results
    assert len(relay.started) == 3 and relay.max_active == 2

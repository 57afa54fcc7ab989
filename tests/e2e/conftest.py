"""End-to-end fixtures: one real node per session, driven by the unmodified E2B SDK.

``WARREN_E2E_DOMAIN=1`` runs that node in domain mode (``--domain warren.localhost:<port>``, HTTPS with
a node CA): the SDK then gets only ``E2B_API_URL`` and ``E2B_DOMAIN``, no ``E2B_SANDBOX_URL``, so any
suite here runs as a user of domain mode would run it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.framework.node import DEFAULT_CACHE, Node, running_node

RUNTIMES = ["runc", "gvisor"]


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("end-to-end tests start real sandboxes and need root")
    if not (DEFAULT_CACHE / "templates" / "base" / "rootfs").is_dir():
        pytest.skip(f"no built-in templates in {DEFAULT_CACHE}: run `warren setup` (scripts/setup.sh) first")


@contextmanager
def e2e_node(
    tmp_path_factory: pytest.TempPathFactory, runsc: Path, domain_ca: Path | None, extra: dict[str, str] | None = None
) -> Iterator[Node]:
    """A started node with ``base-gvisor`` imported (in domain mode with ``domain_ca``)."""
    _need_root()
    # Tests import rootfs copies they make under pytest's temp dir besides the built-in templates.
    roots = {"WARREN_IMPORT_ROOTS": f"{DEFAULT_CACHE}:{tmp_path_factory.getbasetemp()}", **(extra or {})}
    state = tmp_path_factory.mktemp("node") / "state"
    with running_node(state, runsc=runsc, extra_env=roots, domain_ca=domain_ca) as n:
        with n.client() as c:
            src = str(DEFAULT_CACHE / "templates" / "base" / "rootfs")
            r = c.post("/warren/templates/import", json={"path": src, "name": "base-gvisor", "runtime": "gvisor"})
            assert r.status_code == 201, r.text
        yield n


VIA_GATEWAY = os.environ.get("WARREN_E2E_VIA_GATEWAY") == "1"
"""``WARREN_E2E_VIA_GATEWAY=1``: the node joins a cluster (a real redis-server) and the SDK talks to it
through a ``warren gateway``; the tests' own admin calls (``node.client()``) still go to the node."""


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory, patched_runsc: Path, node_ca: Path) -> Iterator[Node]:
    domain_ca = node_ca if os.environ.get("WARREN_E2E_DOMAIN") == "1" else None
    if not VIA_GATEWAY:
        with e2e_node(tmp_path_factory, patched_runsc, domain_ca) as n:
            yield n
        return
    from tests.framework.cluster import HEARTBEAT_S, TTL_S, Gateway
    from tests.framework.redis import running_redis

    with running_redis(tmp_path_factory.mktemp("redis")) as redis:
        cluster = {"WARREN_CLUSTER_REDIS": redis.url, "WARREN_CLUSTER_HEARTBEAT_S": str(HEARTBEAT_S),
                   "WARREN_CLUSTER_TTL_S": str(TTL_S)}  # fmt: skip
        with e2e_node(tmp_path_factory, patched_runsc, None, cluster) as n:
            gateway = Gateway(tmp_path_factory.mktemp("gateway"), redis.url, n.api_key)
            gateway.start()
            try:
                n.sdk_url = gateway.url
                time.sleep(2 * HEARTBEAT_S)  # the node's record has the imported template
                yield n
            finally:
                gateway.stop()


@pytest.fixture(autouse=True)
def _sdk_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if "node" in request.fixturenames:
        node = request.getfixturevalue("node")
        for k in ("E2B_SANDBOX_URL", "E2B_DOMAIN"):
            monkeypatch.delenv(k, raising=False)
        for k, v in node.env().items():
            monkeypatch.setenv(k, v)


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest, node: Node) -> str:
    name = str(request.param)
    if name == "gvisor":
        with node.client() as c:
            probe = c.get("/health").json()["runtimes"].get("gvisor", {})
        if not probe.get("available"):
            pytest.skip(f"gVisor unavailable on this node: {probe.get('reason')}")
    return name


@pytest.fixture
def template(runtime: str) -> str:
    """The base template for the runtime under test."""
    return "base" if runtime == "runc" else "base-gvisor"


@pytest.fixture
def sbx(node: Node, template: str) -> Iterator[Sandbox]:
    """A fresh sandbox of the runtime under test, killed afterwards (a no-op if the test killed it)."""
    box = Sandbox.create(template=template, timeout=300)
    try:
        yield box
    finally:
        Sandbox.kill(box.sandbox_id)

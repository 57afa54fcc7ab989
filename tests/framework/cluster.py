"""A cluster on one host for tests: nodes (``warren serve --cluster-redis``) and gateways (``warren gateway``)
as subprocesses around one real redis-server, all sharing one API key."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.framework.node import DEFAULT_CACHE, DOMAIN_HOST, Node, free_port
from tests.framework.redis import RedisServer

HEARTBEAT_S = 0.5
TTL_S = 3.0


@dataclass
class Gateway:
    workdir: Path
    redis_url: str
    api_key: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    domain_ca: Path | None = None
    """Domain mode (``--domain warren.localhost:<port>``) when set: a CA directory (``ca.pem``, ``ca-key.pem``)
    copied into the gateway's ``<state-dir>/tls``, so it signs its leaf with a CA the test process trusts."""
    tls_cert: tuple[Path, Path] | None = None
    """Domain mode with the operator's certificate and key (``--tls-cert``/``--tls-key``), signed by ``domain_ca``."""

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    @property
    def domain(self) -> str | None:
        return f"{DOMAIN_HOST}:{self.port}" if self.domain_ca else None

    @property
    def url(self) -> str:
        return f"{'https' if self.domain_ca else 'http'}://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"gateway-{self.port}.log"

    def sdk(self) -> dict[str, str]:
        """The E2B SDK's connection options for this gateway: in domain mode no ``sandbox_url``."""
        if self.domain is not None:
            return {"api_url": f"https://api.{self.domain}", "domain": self.domain, "api_key": self.api_key}
        return {"api_url": self.url, "sandbox_url": self.url, "api_key": self.api_key}

    def verify(self) -> ssl.SSLContext | bool:
        if self.domain_ca is None:
            return True
        return ssl.create_default_context(cafile=str(self.domain_ca / "ca.pem"))

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-API-Key": self.api_key}, timeout=120, verify=self.verify())

    def start(self, timeout: float = 30.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "warren.cli.main", "gateway", "--redis", self.redis_url,
                "--listen", f"127.0.0.1:{self.port}"]  # fmt: skip
        if self.domain_ca is not None and self.domain is not None:
            argv += ["--domain", self.domain, "--state-dir", str(self.state_dir)]
            if self.tls_cert is not None:
                argv += ["--tls-cert", str(self.tls_cert[0]), "--tls-key", str(self.tls_cert[1])]
            else:
                tls = self.state_dir / "tls"
                tls.mkdir(parents=True, exist_ok=True, mode=0o700)
                for name in ("ca.pem", "ca-key.pem"):
                    if not (tls / name).exists():
                        shutil.copy(self.domain_ca / name, tls / name)
        env = {**os.environ, "WARREN_API_KEY": self.api_key, "PYTHONUNBUFFERED": "1"}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"warren gateway exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=1, verify=self.verify()).status_code in (200, 503):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"warren gateway did not come up in {timeout}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "(no log)"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Cluster:
    redis: RedisServer
    nodes: list[Node]
    gateways: list[Gateway]
    api_key: str

    def node(self, node_id: str) -> Node:
        return next(n for n in self.nodes if n.extra_env["WARREN_NODE_ID"] == node_id)

    def wait_nodes(self, want: dict[str, str], timeout: float = 20.0) -> list[dict[str, object]]:
        """Poll ``GET /nodes`` on the first gateway until each named node has the wanted status."""
        deadline = time.monotonic() + timeout
        seen: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError), self.gateways[0].client() as c:
                answer = c.get("/nodes")
                if answer.status_code == 200:
                    seen = answer.json()
                    status = {str(n["nodeID"]): str(n["status"]) for n in seen}
                    if all(status.get(k) == v for k, v in want.items()):
                        return seen
            time.sleep(0.1)
        raise AssertionError(f"nodes did not reach {want}: {seen}")


def own_network(index: int) -> dict[str, str]:
    """The environment that gives node ``index`` of a one-host test cluster a network of its own, as
    separate hosts would have: netns and veth names, nft table, address pool and cgroup parent (the node
    name). A sandbox that moves between nodes keeps its id, so nodes sharing these would collide on its
    netns and cgroup."""
    return {"WARREN_NETWORK_PREFIX": f"k{index}", "WARREN_NETWORK_TABLE": own_table(index),
            "WARREN_NETWORK_CIDR": f"10.{80 + index}.0.0/16", "WARREN_NODE_NAME": f"warren-k{index}"}  # fmt: skip


def own_table(index: int) -> str:
    return f"warren_k{index}"


def cluster_node(state_dir: Path, node_id: str, redis_url: str, api_key: str, runsc: Path | None,
                 max_sandboxes: int, shared_store: dict[str, str] | None = None,
                 network: dict[str, str] | None = None) -> Node:  # fmt: skip
    """A node of a test cluster; ``shared_store``: the environment that gives it one (``WARREN_SHARED_STORE``...);
    ``network``: its own network (:func:`own_network`), else the host's default one, shared."""
    env = {
        **(shared_store or {}),
        **(network or {}),
        "WARREN_WARM_POOL": "0",
        "WARREN_CLUSTER_REDIS": redis_url,
        "WARREN_NODE_ID": node_id,
        "WARREN_CLUSTER_HEARTBEAT_S": str(HEARTBEAT_S),
        "WARREN_CLUSTER_TTL_S": str(TTL_S),
        "WARREN_MAX_SANDBOXES": str(max_sandboxes),
    }
    return Node(state_dir=state_dir, port=free_port(), api_key=api_key, runsc=runsc, cache_dir=DEFAULT_CACHE,
                extra_env=env)  # fmt: skip


def need_cluster_host() -> None:
    """Skip unless this process can start real sandboxes (root, built-in templates)."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("cluster tests start real sandboxes and need root")
    if not (DEFAULT_CACHE / "templates" / "base" / "rootfs").is_dir():
        pytest.skip(f"no built-in templates in {DEFAULT_CACHE}: run `warren setup` first")


def import_base_gvisor(node: Node) -> None:
    """The ``base-gvisor`` template on ``node`` (the built-in rootfs imported under gVisor)."""
    with node.client() as c:
        src = str(DEFAULT_CACHE / "templates" / "base" / "rootfs")
        r = c.post("/warren/templates/import", json={"path": src, "name": "base-gvisor", "runtime": "gvisor"})
        assert r.status_code == 201, r.text


@contextlib.contextmanager
def running_cluster(
    redis: RedisServer, nodes: list[Node], gateways: list[Gateway], api_key: str, *, gvisor_template: bool = False,
    tables: tuple[str, ...] = (),
) -> Iterator[Cluster]:
    """Start the nodes (with ``base-gvisor`` when asked), then the gateways, and wait until every node is
    ready; at the end stop them in reverse (each node's sandboxes killed first) and delete the nodes'
    own nft ``tables`` (:func:`own_network`)."""
    started: list[Node | Gateway] = []
    try:
        for node in nodes:
            node.state_dir.parent.mkdir(parents=True, exist_ok=True)
            node.start()
            started.append(node)
            if gvisor_template:
                import_base_gvisor(node)
        for gw in gateways:
            gw.start()
            started.append(gw)
        cluster = Cluster(redis, nodes, gateways, api_key)
        cluster.wait_nodes({n.extra_env["WARREN_NODE_ID"]: "ready" for n in nodes})
        yield cluster
    finally:
        for item in reversed(started):
            if isinstance(item, Node):
                with contextlib.suppress(Exception):
                    item.kill_all_sandboxes()
            item.stop()
        for table in tables:
            subprocess.run(["nft", "delete", "table", "inet", table], check=False, capture_output=True)

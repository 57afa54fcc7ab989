"""Domain mode at the gateway: two header-mode nodes behind gateways started with
``--domain warren.localhost:<port>``, which serve HTTPS for ``api.D`` and ``<port>-<id>.D`` and route
sandbox hosts to the bound node over plain HTTP. The unmodified SDK, given only an API URL and a domain
(no sandbox URL), works through them; so does the older SDK (e2b 2.8.1), whose envd calls carry only
``X-Access-Token`` and so need domain mode.

One gateway makes its leaf with its own CA (the session's CA, copied into ``<state-dir>/tls`` as the
node fixtures do, since the SDK reads ``SSL_CERT_FILE`` once per process); the other is given a
certificate and key (``--tls-cert``/``--tls-key``), as gateways behind a load balancer would be.

Name resolution: the pinned SDK (pyqwest) maps ``*.localhost`` to loopback; Python's resolver does not,
so this file's own httpx clients and the older SDK's subprocess patch ``socket.getaddrinfo`` for
``*.localhost`` names (standing in for an operator's wildcard DNS record).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox
from e2b.sandbox.commands.command_handle import PtySize

from tests.framework.cluster import Cluster, Gateway, cluster_node, need_cluster_host, running_cluster
from tests.framework.redis import RedisServer

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
NODE_IDS = ("dom-a", "dom-b")
NO_DOMAIN = "no-domain.set-e2b-sandbox-url.invalid"


@pytest.fixture(scope="module")
def cluster(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, patched_runsc: Path, node_ca: Path
) -> Iterator[Cluster]:
    need_cluster_host()
    key = "wrn_test_" + os.urandom(8).hex()
    base = tmp_path_factory.mktemp("cluster-domain")
    nodes = [cluster_node(base / i / "state", i, redis_server.url, key, patched_runsc, 4) for i in NODE_IDS]
    gateways = [
        Gateway(base / "gw-ca", redis_server.url, key, domain_ca=node_ca),
        Gateway(base / "gw-cert", redis_server.url, key, domain_ca=node_ca,
                tls_cert=(node_ca / "cert.pem", node_ca / "key.pem")),
    ]  # fmt: skip
    with running_cluster(redis_server, nodes, gateways, key) as c:
        yield c


@pytest.fixture(autouse=True)
def no_sandbox_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """Domain mode: the SDK builds envd URLs from the answered domain, never from a sandbox URL."""
    for name in ("E2B_SANDBOX_URL", "E2B_API_URL", "E2B_DOMAIN", "E2B_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def node_of(cluster: Cluster, sandbox_id: str) -> str:
    for node_id in NODE_IDS:
        with cluster.node(node_id).client() as c:
            if c.get(f"/sandboxes/{sandbox_id}").status_code == 200:
                return node_id
    raise AssertionError(f"no node has {sandbox_id}")


@pytest.mark.parametrize("which", [0, 1], ids=["own-ca", "tls-cert"])
def test_the_sdk_in_domain_mode_through_the_gateway(cluster: Cluster, which: int) -> None:
    gw = cluster.gateways[which]
    sbx = Sandbox.create(template="base", timeout=300, **gw.sdk())
    try:
        assert sbx.sandbox_domain == gw.domain
        assert node_of(cluster, sbx.sandbox_id) in NODE_IDS
        assert sbx.commands.run("echo $((6 * 7))").stdout.strip() == "42"
        sbx.files.write("/home/user/d.txt", "by domain, through a gateway")
        assert sbx.files.read("/home/user/d.txt") == "by domain, through a gateway"
        handle = sbx.commands.run("sleep 0.3; echo done", background=True)
        assert handle.wait().stdout.strip() == "done"
        pty = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
        out = bytearray()
        sbx.pty.send_stdin(pty.pid, b"stty size; echo PTY_$((6*7)); exit\n")
        for _, _, chunk in pty:
            out.extend(chunk or b"")
        assert b"PTY_42" in out and b"24 80" in out
        other = Sandbox.connect(sbx.sandbox_id, **cluster.gateways[1 - which].sdk())
        assert other.sandbox_domain == cluster.gateways[1 - which].domain
        assert other.files.read("/home/user/d.txt") == "by domain, through a gateway"
    finally:
        assert sbx.kill() is True
    with gw.client() as c:
        assert c.get(f"/sandboxes/{sbx.sandbox_id}").status_code == 404


def test_sandbox_answers_carry_the_gateway_domain(cluster: Cluster, loopback_localhost: None) -> None:
    gw = cluster.gateways[0]
    with gw.client() as c:
        created = c.post("/sandboxes", json={"templateID": "base", "timeout": 120})
        assert created.status_code == 201, created.text
        sandbox_id = created.json()["sandboxID"]
        try:
            assert created.json()["domain"] == gw.domain
            with cluster.node(node_of(cluster, sandbox_id)).client() as node:
                assert node.get(f"/sandboxes/{sandbox_id}").json()["domain"] == NO_DOMAIN  # a header-mode node
            assert c.get(f"/sandboxes/{sandbox_id}").json()["domain"] == gw.domain
            connected = c.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": 120})
            assert connected.status_code in (200, 201), connected.text
            assert connected.json()["domain"] == gw.domain
            token = created.json()["envdAccessToken"]
            # envd by host name only, as SDKs before 2.9 call it: no E2b-Sandbox-Id header.
            with httpx.Client(verify=gw.verify(), timeout=30) as envd:
                health = envd.get(f"https://49983-{sandbox_id}.{gw.domain}/health")
                assert health.status_code in (200, 204), health.text
                files = envd.get(
                    f"https://49983-{sandbox_id}.{gw.domain}/files",
                    params={"path": "/etc/hostname", "username": "user"},
                    headers={"X-Access-Token": token} if token else {},
                )
                assert files.status_code == 200, files.text
                api = envd.get(f"https://api.{gw.domain}/sandboxes/{sandbox_id}", headers={"X-API-Key": gw.api_key})
                assert api.status_code == 200 and api.json()["domain"] == gw.domain
        finally:
            c.delete(f"/sandboxes/{sandbox_id}")


def test_the_gateway_names_its_ca(cluster: Cluster) -> None:
    own, given = cluster.gateways
    ca = own.state_dir / "tls" / "ca.pem"
    assert f"SSL_CERT_FILE={ca}" in own.log_path.read_text()
    with own.client() as c:
        health = c.get("/health").json()
    assert health["domain"] == own.domain and health["tlsCA"] == str(ca)
    with given.client() as c:
        health = c.get("/health").json()
    assert health["domain"] == given.domain and "tlsCA" not in health
    assert not (given.state_dir / "tls").exists()


OLDER_SDK_SCRIPT = textwrap.dedent(
    """
    import json, socket, sys
    sys.path.insert(0, sys.argv[1])
    real = socket.getaddrinfo
    def getaddrinfo(host, *args, **kwargs):  # an operator's wildcard DNS record, in this process only
        if isinstance(host, str) and host.endswith(".localhost"):
            host = "127.0.0.1"
        return real(host, *args, **kwargs)
    socket.getaddrinfo = getaddrinfo
    import e2b
    from importlib.metadata import version
    from e2b import Sandbox
    assert e2b.__file__.startswith(sys.argv[1]), e2b.__file__
    sbx = Sandbox.create(template="base", timeout=120)
    out = {"version": version("e2b"), "domain": sbx.sandbox_domain}
    try:
        out["echo"] = sbx.commands.run("echo $((6 * 7))").stdout.strip()
        sbx.files.write("/home/user/old.txt", "older sdk")
        out["read"] = sbx.files.read("/home/user/old.txt")
        out["background"] = sbx.commands.run("sleep 0.2; echo bg", background=True).wait().stdout.strip()
        again = Sandbox.connect(sbx.sandbox_id)
        out["connected"] = again.commands.run("cat /home/user/old.txt").stdout
    finally:
        out["killed"] = sbx.kill()
    print("RESULT " + json.dumps(out))
    """
)


def test_the_older_sdk_through_the_gateway(cluster: Cluster, node_ca: Path) -> None:
    locks = sorted(REPO.glob("requirements-e2b-*.lock"))
    assert locks
    pinned = next(line.split("==", 1)[1].strip() for line in locks[0].read_text().splitlines()
                  if line.startswith("e2b=="))  # fmt: skip
    sdk = REPO / ".sdk" / f"e2b-{pinned}"
    if not (sdk / ".warren-sdk").is_file():
        pytest.skip(f"{sdk} is missing: run scripts/setup.sh (its sdk stage)")
    gw = cluster.gateways[0]
    assert gw.domain is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_") and k != "PYTHONPATH"}
    env |= {"E2B_API_URL": f"https://api.{gw.domain}", "E2B_DOMAIN": gw.domain, "E2B_API_KEY": gw.api_key,
            "SSL_CERT_FILE": os.environ["SSL_CERT_FILE"]}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", OLDER_SDK_SCRIPT, str(sdk)],
        cwd="/", env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    line = next((x for x in result.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, f"the older SDK failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    out = json.loads(line.removeprefix("RESULT "))
    assert out == {"version": pinned, "domain": gw.domain, "echo": "42", "read": "older sdk", "background": "bg",
                   "connected": "older sdk", "killed": True}  # fmt: skip

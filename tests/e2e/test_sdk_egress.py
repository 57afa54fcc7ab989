"""Egress policy through the unmodified SDK, checked from inside real sandboxes (runc and gVisor):
``network.allowOut``/``denyOut`` by IP, CIDR, domain and wildcard, header ``rules`` for HTTP and HTTPS,
``update_network`` live, and the same after pause/resume, snapshot and fork.

The "internet" is :mod:`tests.e2e.egress_world` (a netns with an echo server and dnsmasq); this module
runs its own node whose sandboxes resolve through that dnsmasq.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import AsyncSandbox, Sandbox

from tests.e2e.egress_world import ADDRS, DNS_IP, NETNS, SOCKS_IP, World, internet
from tests.framework.leaks import assert_no_leaks, snapshot
from tests.framework.node import DEFAULT_CACHE, Node, running_node

TABLE = "warren_egress_test"
NET = {"WARREN_NETWORK_TABLE": TABLE, "WARREN_NETWORK_PREFIX": "x", "WARREN_NETWORK_CIDR": "10.76.0.0/16"}
"""Apart from other nodes on the host (they rewrite the shared table's chains with their own code)."""
SECRET = "Bearer s3cret-egress-7f3a"
DNS = {"dns_servers": [DNS_IP]}
DENY_ALL = {"deny_out": ["0.0.0.0/0"]}

FETCH = r'''
import json, ssl, sys, urllib.request
url, verify = sys.argv[1], sys.argv[2] == "1"
ctx = ssl.create_default_context() if verify else ssl._create_unverified_context()
req = urllib.request.Request(url, headers={"Host": sys.argv[3]} if len(sys.argv) > 3 else {})
try:
    with urllib.request.urlopen(req, timeout=6, context=ctx) as r:
        print(json.dumps({"ok": True, "status": r.status, "body": json.loads(r.read())}))
except Exception as e:
    print(json.dumps({"ok": False, "error": repr(e)[:300]}))
'''


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    if os.geteuid() != 0:
        pytest.skip("egress tests make network namespaces and need root")
    before = snapshot(state_dirs=[], cgroup_parents=(), netns_prefixes=("wegr", "wrx-"), link_prefixes=("wegr", "wx"),
                      nft_tables=())
    try:
        with internet(tmp_path_factory.mktemp("egress-world")) as w:
            yield w
    except LookupError as exc:
        pytest.skip(str(exc))
    assert_no_leaks(before)


@pytest.fixture(scope="module")
def node(world: World, tmp_path_factory: pytest.TempPathFactory, patched_runsc: Path) -> Iterator[Node]:
    """A node of this module's own: sandboxes resolve through the test dnsmasq; the proxy trusts the test CA."""
    if not (DEFAULT_CACHE / "templates" / "base" / "rootfs").is_dir():
        pytest.skip(f"no built-in templates in {DEFAULT_CACHE}: run `warren setup` first")
    env = {"WARREN_DNS_SERVERS": DNS_IP, "WARREN_EGRESS_UPSTREAM_CA": str(world.ca_file),
           "WARREN_IMPORT_ROOTS": str(DEFAULT_CACHE), **NET}
    with running_node(tmp_path_factory.mktemp("egress-node") / "state", runsc=patched_runsc, extra_env=env) as n:
        with n.client() as c:
            src = str(DEFAULT_CACHE / "templates" / "base" / "rootfs")
            r = c.post("/warren/templates/import", json={"path": src, "name": "base-gvisor", "runtime": "gvisor"})
            assert r.status_code == 201, r.text
        yield n
    # Every sandbox is gone: none of their per-sandbox egress chains may be left in the table.
    listing = subprocess.run(["nft", "list", "table", "inet", TABLE], capture_output=True, text=True).stdout
    assert "ef-wx" not in listing and "en-wx" not in listing, listing
    subprocess.run(["nft", "delete", "table", "inet", TABLE], check=False)


def fetch(box: Sandbox, url: str, *, verify: bool = False, host: str | None = None) -> dict[str, Any]:
    box.files.write("/tmp/fetch.py", FETCH)
    argv = f"python3 /tmp/fetch.py {url} {int(verify)}" + (f" {host}" if host else "")
    out = box.commands.run(argv, timeout=30).stdout.strip()
    return dict(json.loads(out.splitlines()[-1]))


def reaches(box: Sandbox, url: str, **kw: Any) -> bool:
    return bool(fetch(box, url, **kw)["ok"])


def make(template: str, network: dict[str, Any] | None = None, **kw: Any) -> Sandbox:
    return Sandbox.create(template=template, timeout=300, network=network, **kw)  # type: ignore[arg-type]


def test_ip_and_cidr_allowed_the_rest_denied(node: Node, template: str) -> None:
    box = make(template, {**DENY_ALL, "allow_out": [ADDRS["allowed"], "203.0.113.12/31"]})
    try:
        assert reaches(box, f"http://{ADDRS['allowed']}/")
        assert reaches(box, f"http://{ADDRS['example']}:8080/")
        assert not reaches(box, f"http://{ADDRS['other']}/")
        info = Sandbox.get_info(box.sandbox_id)
        assert info is not None
    finally:
        box.kill()


def test_deny_one_address_leaves_the_rest_open(node: Node, template: str) -> None:
    box = make(template, {"deny_out": [f"{ADDRS['other']}/32"]})
    try:
        assert reaches(box, f"http://{ADDRS['allowed']}/") and reaches(box, "http://allowed.test/")
        assert not reaches(box, f"http://{ADDRS['other']}/") and not reaches(box, "https://other.test/")
    finally:
        box.kill()


def test_domains_and_wildcards_behind_deny_all(node: Node, template: str) -> None:
    box = make(template, {**DENY_ALL, **DNS, "allow_out": ["allowed.test", "*.example.test"]})
    try:
        assert fetch(box, "http://allowed.test/")["body"]["host"] == "allowed.test"
        assert reaches(box, "https://allowed.test/") and reaches(box, "http://allowed.test:8080/")
        assert reaches(box, "http://a.example.test/") and reaches(box, "https://deep.b.example.test/")
        assert not reaches(box, "http://other.test/") and not reaches(box, "https://other.test/")
        assert not reaches(box, "http://example.test/")  # a wildcard does not cover its apex
        assert not reaches(box, "http://api.allowed.test/")  # an exact name covers no subdomain
        # An allowed name sent to a denied address is dialled at the name's own address (the node asks the
        # sandbox's resolver), so a name cannot carry the sandbox to a denied address ...
        fronted = fetch(box, f"http://{ADDRS['other']}/", host="allowed.test")
        assert fronted["ok"] and fronted["body"]["local"] == ADDRS["allowed"], fronted
        # ... and a denied name does not pass on an address an allowed name resolves to.
        assert not reaches(box, f"http://{ADDRS['allowed']}/", host="other.test")
    finally:
        box.kill()


def test_always_denied_ranges_cannot_be_opened(node: Node, template: str) -> None:
    # 198.18.0.0/30 is a subnet of the host (the world's veth): blocked whatever allowOut says.
    box = make(template, {**DENY_ALL, "allow_out": ["198.18.0.0/30", "169.254.169.254", ADDRS["allowed"]]})
    try:
        assert reaches(box, f"http://{ADDRS['allowed']}/")
        assert not reaches(box, "http://198.18.0.2/")
    finally:
        box.kill()


def test_allow_internet_access_false(node: Node, template: str) -> None:
    box = make(template, allow_internet_access=False)
    try:
        assert not reaches(box, f"http://{ADDRS['allowed']}/")
    finally:
        box.kill()
    box = make(template, {"allow_out": [ADDRS["allowed"]]}, allow_internet_access=False)
    try:  # E2B: false is denyOut 0.0.0.0/0, and allowed entries beat it
        assert reaches(box, f"http://{ADDRS['allowed']}/") and not reaches(box, f"http://{ADDRS['other']}/")
    finally:
        box.kill()


def _assert_secret_absent(box: Sandbox) -> None:
    env = box.commands.run("env; cat /proc/1/environ | tr '\\0' '\\n'", user="root").stdout
    assert "s3cret" not in env
    found = box.commands.run("grep -rls s3cret-egress /etc /root /home /tmp /usr/local /var || true",
                             user="root", timeout=60).stdout
    assert found.strip() == ""


def test_header_rules_reach_the_upstream_not_the_sandbox(node: Node, template: str) -> None:
    rules = {"allowed.test": [{"transform": {"headers": {"Authorization": SECRET}}}],
             "*.example.test": [{"transform": {"headers": {"X-Team": "blue"}}}]}
    box = make(template, {"rules": rules})
    try:
        plain = fetch(box, "http://allowed.test/")["body"]["headers"]
        assert plain.get("Authorization") == SECRET
        tls = fetch(box, "https://allowed.test/", verify=True)  # the node CA is in the sandbox's trust store
        assert tls["ok"], tls
        assert tls["body"]["headers"].get("Authorization") == SECRET
        assert fetch(box, "https://a.example.test/", verify=True)["body"]["headers"].get("X-Team") == "blue"
        other = fetch(box, "https://other.test/")  # no rule: passed through untouched, the upstream's own cert
        assert other["ok"] and "Authorization" not in other["body"]["headers"]
        assert not reaches(box, "https://other.test/", verify=True)  # the test CA is not trusted in there
        _assert_secret_absent(box)
    finally:
        box.kill()


def test_live_update_replaces_the_policy(node: Node, template: str) -> None:
    box = make(template)
    try:
        assert reaches(box, "http://other.test/")
        box.update_network({"deny_out": ["0.0.0.0/0"], "allow_out": ["allowed.test"], "dns_servers": [DNS_IP]})
        assert not reaches(box, "http://other.test/") and reaches(box, "http://allowed.test/")
        net = node.client().get(f"/sandboxes/{box.sandbox_id}").json()["network"]
        assert net["allowOut"] == ["allowed.test"] and net["denyOut"] == ["0.0.0.0/0"]
        box.update_network({"rules": {"other.test": [{"transform": {"headers": {"Authorization": SECRET}}}]}})
        assert fetch(box, "https://other.test/", verify=True)["body"]["headers"]["Authorization"] == SECRET
        box.update_network({})
        assert reaches(box, "http://other.test/") and "Authorization" not in fetch(
            box, "http://other.test/")["body"]["headers"]
        r = node.client().put(f"/sandboxes/{box.sandbox_id}/network", json={"denyOut": ["example.test"]})
        assert r.status_code == 400 and "domains are not supported" in r.json()["message"]
    finally:
        box.kill()


def test_policy_survives_pause_snapshot_and_fork(node: Node, template: str) -> None:
    # Checkpoints first, fetches after: a gVisor checkpoint wants no TCP connection in flight (B3).
    rules = {"allowed.test": [{"transform": {"headers": {"Authorization": SECRET}}}]}
    box = make(template, {**DENY_ALL, **DNS, "allow_out": ["allowed.test"], "rules": rules})
    children: list[Sandbox] = []
    try:
        box.pause()
        box = Sandbox.connect(box.sandbox_id)
        box.create_snapshot()
        forks = box.fork(count=1)
        assert isinstance(forks[0], Sandbox), forks
        children.append(forks[0])
        for each in (box, forks[0]):
            assert not reaches(each, "http://other.test/")
            assert fetch(each, "https://allowed.test/", verify=True)["body"]["headers"]["Authorization"] == SECRET
    finally:
        for each in (box, *children):
            each.kill()


def test_update_while_paused_applies_at_resume(node: Node, template: str) -> None:
    box = make(template)
    try:
        box.pause()
        Sandbox.update_network(box.sandbox_id, {
            "deny_out": ["0.0.0.0/0"], "allow_out": ["allowed.test"], "dns_servers": [DNS_IP],
            "rules": {"allowed.test": [{"transform": {"headers": {"Authorization": SECRET}}}]}})
        box = Sandbox.connect(box.sandbox_id)
        assert not reaches(box, "http://other.test/")
        assert fetch(box, "https://allowed.test/", verify=True)["body"]["headers"]["Authorization"] == SECRET
    finally:
        box.kill()


def test_egress_proxy_tunnels_what_the_policy_allows(node: Node, world: World, template: str) -> None:
    """``egress_proxy``: allowed TCP goes through the SOCKS5 proxy (names as names, addresses as addresses,
    header rules still applied); denied traffic never reaches it; a wrong password fails closed."""
    proxy = {"address": f"{SOCKS_IP}:1080", "username": "u", "password": "p"}
    rules = {"allowed.test": [{"transform": {"headers": {"Authorization": SECRET}}}]}
    net = {**DENY_ALL, **DNS, "allow_out": ["allowed.test", ADDRS["example"]], "rules": rules, "egress_proxy": proxy}
    box = make(template, net)
    try:
        start = world.socks_log.stat().st_size if world.socks_log.exists() else 0
        assert fetch(box, "http://allowed.test/")["body"]["headers"]["Authorization"] == SECRET
        assert fetch(box, "https://allowed.test/", verify=True)["body"]["headers"]["Authorization"] == SECRET
        assert reaches(box, f"http://{ADDRS['example']}:8080/")
        assert not reaches(box, "http://other.test/")
        log = world.socks_log.read_text()[start:].split()
        assert log == ["allowed.test:80", "allowed.test:443", f"{ADDRS['example']}:8080"], log
        info = node.client().get(f"/sandboxes/{box.sandbox_id}").json()["network"]["egressProxy"]
        assert info == {"address": f"{SOCKS_IP}:1080", "username": "u"}  # never the password
        box.update_network({"allow_out": ["allowed.test"], "deny_out": ["0.0.0.0/0"], "dns_servers": [DNS_IP],
                            "egress_proxy": {**proxy, "password": "wrong"}})
        assert not reaches(box, "http://allowed.test/")
        assert "auth-failed" in world.socks_log.read_text()
    finally:
        box.kill()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_policy_survives_node_restart(node: Node, template: str, sig: int) -> None:
    """SIGKILL: the sandbox keeps running and is re-adopted; SIGTERM: it is paused and resumed. Either way
    its rules come back, redirecting to the restarted node's proxy (a new port)."""
    rules = {"allowed.test": [{"transform": {"headers": {"Authorization": SECRET}}}]}
    box = make(template, {**DENY_ALL, **DNS, "allow_out": ["allowed.test"], "rules": rules})
    try:
        node.stop(sig)
        node.start()
        box = Sandbox.connect(box.sandbox_id)
        assert not reaches(box, "http://other.test/")
        assert fetch(box, "http://allowed.test/")["body"]["headers"]["Authorization"] == SECRET
    finally:
        box.kill()


async def test_async_sdk_create_and_update(node: Node, template: str) -> None:
    box = await AsyncSandbox.create(template=template, timeout=300,
                                    network={"deny_out": ["0.0.0.0/0"], "allow_out": [ADDRS["allowed"]]})
    try:
        await box.files.write("/tmp/fetch.py", FETCH)

        async def ok(url: str) -> bool:
            out = (await box.commands.run(f"python3 /tmp/fetch.py {url} 0", timeout=30)).stdout
            return bool(json.loads(out.strip().splitlines()[-1])["ok"])

        assert await ok(f"http://{ADDRS['allowed']}/") and not await ok(f"http://{ADDRS['other']}/")
        await box.update_network({"deny_out": [f"{ADDRS['allowed']}/32"]})
        assert not await ok(f"http://{ADDRS['allowed']}/") and await ok(f"http://{ADDRS['other']}/")
    finally:
        await box.kill()


async def test_async_sdk_domains_header_rules_and_pause(node: Node, template: str) -> None:
    rules = {"allowed.test": [{"transform": {"headers": {"Authorization": SECRET}}}]}
    box = await AsyncSandbox.create(template=template, timeout=300, network={
        "deny_out": ["0.0.0.0/0"], "allow_out": ["allowed.test"], "dns_servers": [DNS_IP], "rules": rules})
    try:
        await box.pause()  # before any connection (gVisor checkpoints want none in flight)
        box = await AsyncSandbox.connect(box.sandbox_id)
        await box.files.write("/tmp/fetch.py", FETCH)

        async def get(url: str, verify: bool = False) -> dict[str, Any]:
            out = (await box.commands.run(f"python3 /tmp/fetch.py {url} {int(verify)}", timeout=30)).stdout
            return dict(json.loads(out.strip().splitlines()[-1]))

        assert (await get("https://allowed.test/", True))["body"]["headers"]["Authorization"] == SECRET
        assert (await get("http://allowed.test/"))["body"]["headers"]["Authorization"] == SECRET
        assert not (await get("http://other.test/"))["ok"]
        await box.update_network({"deny_out": ["0.0.0.0/0"], "allow_out": ["other.test"], "dns_servers": [DNS_IP]})
        assert (await get("http://other.test/"))["ok"] and not (await get("http://allowed.test/"))["ok"]
        env = (await box.commands.run("env", user="root")).stdout
        assert "s3cret" not in env
    finally:
        await box.kill()


def test_world_is_isolated_from_the_host_resolver() -> None:
    """The test DNS lives in its own namespace: the host's resolv.conf does not name it."""
    assert DNS_IP not in Path("/etc/resolv.conf").read_text()
    assert NETNS.startswith("wegr")

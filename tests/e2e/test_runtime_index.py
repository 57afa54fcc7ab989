"""Runtimes by hash on a real node (seed 003): upgrade the default, refuse a miss, register, advertise."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.framework.node import DEFAULT_CACHE, Node, free_port
from warren.runtime.records import RuntimeConfig, RuntimeRecord
from warren.runtime.registry import file_asset
from warren.snapshots import SnapshotManifest


def _configs(path: Path, runc: Path, runsc_versions: dict[str, Path], default: str) -> dict[str, str]:
    """Write a runtimes file; return version -> hash of each gVisor runtime."""
    configs = [RuntimeConfig("runc", "1", RuntimeRecord("runc", {"runc": file_asset(runc)}), default=True)]
    hashes = {}
    for version, binary in runsc_versions.items():
        record = RuntimeRecord("gvisor", {"runsc": file_asset(binary)}, {"platform": "ptrace"})
        configs.append(RuntimeConfig("gvisor", version, record, default=version == default))
        hashes[version] = record.hash()
    doc = {
        "runtimes": [
            {"name": c.name, "version": c.version, "default": c.default, **c.record.to_dict()} for c in configs
        ]
    }
    path.write_text(json.dumps(doc))
    return hashes


@pytest.fixture
def gvisor_versions(tmp_path: Path, patched_runsc: Path) -> dict[str, Path]:
    """Two runnable runsc binaries with different bytes: the patched copy, and it with bytes appended."""
    v1 = tmp_path / "runsc-v1"
    v2 = tmp_path / "runsc-v2"
    shutil.copy2(patched_runsc, v1)
    shutil.copy2(patched_runsc, v2)
    with v2.open("ab") as f:
        f.write(b"\0warren-test-v2\0")
    return {"v1": v1, "v2": v2}


@pytest.fixture
def index_node(tmp_path: Path, gvisor_versions: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    if os.geteuid() != 0 or not (DEFAULT_CACHE / "templates" / "base" / "rootfs").is_dir():
        pytest.skip("needs root and `warren setup`")
    runtimes = tmp_path / "runtimes.json"
    _configs(runtimes, Path(shutil.which("runc") or "/usr/sbin/runc"), {"v1": gvisor_versions["v1"]}, "v1")
    node = Node(state_dir=tmp_path / "state", port=free_port(), api_key="wrn_idx_" + os.urandom(6).hex(),
                runsc=gvisor_versions["v1"], extra_env={"WARREN_WARM_POOL": "0", "WARREN_RUNTIMES": str(runtimes)})
    node.start()
    for k, v in node.env().items():
        monkeypatch.setenv(k, v)
    with node.client() as c:
        src = str(DEFAULT_CACHE / "templates" / "busybox" / "rootfs")
        r = c.post("/warren/templates/import", json={"path": src, "name": "bb-g", "runtime": "gvisor"})
        assert r.status_code == 201
    try:
        yield node
    finally:
        node.kill_all_sandboxes()
        node.stop()


def test_upgrade_keeps_paused_sandboxes_on_their_runtime(index_node: Node, tmp_path: Path,
                                                          gvisor_versions: dict[str, Path]) -> None:
    runtimes = tmp_path / "runtimes.json"
    runc = Path(shutil.which("runc") or "/usr/sbin/runc")
    hashes = _configs(runtimes, runc, {"v1": gvisor_versions["v1"]}, "v1")
    old = Sandbox.create(template="bb-g", timeout=600)
    old.files.write("/tmp/mem.txt", "old")  # tmpfs: lives in the memory image
    old.pause()
    hashes = _configs(runtimes, runc, gvisor_versions, "v2")
    with index_node.client() as c:
        listed = c.post("/warren/runtimes/reload").json()
        assert {r["hash"] for r in listed if r["class"] == "gvisor"} == set(hashes.values())
        assert next(r for r in listed if r["default"] and r["class"] == "gvisor")["hash"] == hashes["v2"]
        node_desc = c.get(f"/nodes/{c.get('/nodes').json()[0]['nodeID']}").json()
        assert set(hashes.values()) <= set(node_desc["runtimeHashes"])
    new = Sandbox.create(template="bb-g", timeout=600)
    try:
        sandboxes = index_node.state_dir / "sandboxes"
        assert _binary(sandboxes / new.sandbox_id) != _binary(sandboxes / old.sandbox_id)
        resumed = Sandbox.connect(old.sandbox_id)
        assert resumed.files.read("/tmp/mem.txt") == "old"
        snap_old = resumed.create_snapshot()
        snap_new = new.create_snapshot()
        with index_node.client() as c:
            manifests = {s["snapshotID"]: s for s in c.get("/snapshots").json()}
        repo = index_node.state_dir / "snapshots"
        assert _manifest_hash(repo, snap_old.snapshot_id) == hashes["v1"]
        assert _manifest_hash(repo, snap_new.snapshot_id) == hashes["v2"]
        assert snap_old.snapshot_id in manifests
    finally:
        new.kill()


def test_miss_is_409_until_registered(index_node: Node, tmp_path: Path, gvisor_versions: dict[str, Path]) -> None:
    box = Sandbox.create(template="bb-g", timeout=600)
    box.files.write("/tmp/x", "x")
    snap = box.create_snapshot()
    box.kill()
    manifest = index_node.state_dir / "snapshots" / snap.snapshot_id / "manifest.json"
    doc = json.loads(manifest.read_text())
    ghost = RuntimeRecord("gvisor", {"runsc": file_asset(gvisor_versions["v2"])}, {"platform": "ptrace"})
    m = SnapshotManifest.decode(manifest.read_bytes())
    manifest.write_bytes(dataclasses.replace(m, runtime_hash=ghost.hash()).encode())
    assert doc["snapshot"]["runtime_hash"] != ghost.hash()
    before = set((index_node.state_dir / "sandboxes").iterdir())
    with index_node.client() as c:
        r = c.post("/v2/sandboxes", json={"templateID": snap.snapshot_id})
        assert r.status_code == 409 and ghost.hash() in r.json()["message"]
        assert set((index_node.state_dir / "sandboxes").iterdir()) == before  # no sandbox dir was created
        assert not any(p.name == ghost.assets["runsc"].sha256 for p in (index_node.state_dir / "assets").rglob("*"))
        reg = c.post("/warren/runtimes", json=ghost.to_dict())
        assert reg.status_code == 201 and reg.json()["hash"] == ghost.hash()
        r = c.post("/v2/sandboxes", json={"templateID": snap.snapshot_id})
        assert r.status_code == 201, r.text
        c.delete(f"/sandboxes/{r.json()['sandboxID']}")


def _binary(sandbox_dir: Path) -> str:
    return str(json.loads((sandbox_dir / "sandbox.json").read_text())["binary"])


def _manifest_hash(repo: Path, snapshot_id: str) -> str:
    return str(json.loads((repo / snapshot_id / "manifest.json").read_text())["snapshot"]["runtime_hash"])

"""Sandboxes run on the runtime hash they were made with (seed 003): a miss is 409, no fallback."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.framework.fakes import FakeAgent, FakeRuntime
from warren.config import Settings
from warren.errors import ConflictError
from warren.orchestrator import CreateRequest, SandboxManager
from warren.runtime.assets import AssetCache
from warren.runtime.base import RuntimeKind
from warren.runtime.index import RuntimeIndex, RuntimeMissError
from warren.runtime.records import RuntimeConfig, RuntimeRecord
from warren.runtime.registry import RuntimeRegistry, file_asset
from warren.snapshots import SnapshotRepository
from warren.store import Database, SandboxRepo, TemplateRecord, TemplateRepo


def _config(tmp: Path, name: str, payload: bytes, default: bool) -> RuntimeConfig:
    binary = tmp / f"runc-{name}"
    binary.write_bytes(payload)
    return RuntimeConfig("runc", name, RuntimeRecord("runc", {"runc": file_asset(binary)}), default=default)


TEMPLATE = TemplateRecord("t1", "base", "runc", ("/l",), {}, None, None, None, None, 1, 256, 1, 0.0)


def _registry(tmp: Path) -> RuntimeRegistry:
    return RuntimeRegistry(RuntimeIndex(tmp / "index.json"), AssetCache(tmp / "assets", max_bytes=1 << 20))


async def test_snapshot_with_unknown_runtime_is_refused_then_works_once_registered(tmp_path: Path) -> None:
    agent = FakeAgent()
    await agent.start()
    db = Database(tmp_path / "w.db")
    await TemplateRepo(db).put(TEMPLATE)
    v1 = _config(tmp_path, "v1", b"runtime one", True)
    registry = _registry(tmp_path)
    await registry.configure([v1])
    runtime = FakeRuntime(RuntimeKind.RUNC, agent)
    repo = SnapshotRepository(tmp_path / "snapshots")
    manager = SandboxManager(
        settings=Settings(state_dir=tmp_path, warm_pool_size=0),
        sandboxes=SandboxRepo(db),
        templates=TemplateRepo(db),
        runtimes={RuntimeKind.RUNC: runtime},
        snapshots=repo,
        registry=registry,
    )
    src = await manager.create(CreateRequest(template="base"))
    assert src.binding.runtime_hash == v1.record.hash()
    snap = await manager.snapshot(src.id, "s1")
    assert snap.runtime_hash == v1.record.hash()

    # Make the snapshot name a runtime this node never registered.
    ghost = RuntimeRecord("runc", {"runc": file_asset(tmp_path / "runc-v1")}, {"flavour": "ghost"})
    manifest_path = repo.path(snap.snapshot_id) / "manifest.json"
    manifest_path.write_bytes(dataclasses.replace(snap, runtime_hash=ghost.hash()).encode())
    before = set(runtime.running)
    with pytest.raises(RuntimeMissError, match=ghost.hash()) as info:
        await manager.create(CreateRequest(template="s1"))
    assert isinstance(info.value, ConflictError)
    assert set(runtime.running) == before and not runtime.restored_from

    await registry.index.register(ghost)
    child = await manager.create(CreateRequest(template="s1"))
    assert child.binding.runtime_hash == ghost.hash()
    await agent.close()
    db.close()


async def test_upgrade_keeps_old_sandboxes_on_their_runtime(tmp_path: Path) -> None:
    agent = FakeAgent()
    await agent.start()
    db = Database(tmp_path / "w.db")
    await TemplateRepo(db).put(TEMPLATE)
    v1 = _config(tmp_path, "v1", b"runtime one", True)
    registry = _registry(tmp_path)
    await registry.configure([v1])
    runtime = FakeRuntime(RuntimeKind.RUNC, agent)
    manager = SandboxManager(
        settings=Settings(state_dir=tmp_path, warm_pool_size=0),
        sandboxes=SandboxRepo(db),
        templates=TemplateRepo(db),
        runtimes={RuntimeKind.RUNC: runtime},
        registry=registry,
    )
    old = await manager.create(CreateRequest(template="base"))
    await manager.pause(old.id)
    v2 = _config(tmp_path, "v2", b"runtime two", True)
    await registry.configure([dataclasses.replace(v1, default=False), v2])
    new = await manager.create(CreateRequest(template="base"))
    assert new.binding.runtime_hash == v2.record.hash() != old.binding.runtime_hash
    resumed, was_paused = await manager.connect(old.id, None)
    assert was_paused and resumed.binding.runtime_hash == v1.record.hash()
    await agent.close()
    db.close()

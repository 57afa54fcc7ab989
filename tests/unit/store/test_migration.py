"""A database written before the typed records (``extra`` as one JSON dict) opens, migrates in place
and serves its paused sandboxes.

The fixture ``fixtures/warren-v1.db`` was written by the orchestrator as of commit 84d56c1 (by
``fixtures/make_v1_db.py.txt``): a sandbox paused with memory (auto-resume, timeout pauses), one paused
filesystem-only, and a running one restored from a snapshot, all on a staged runtime hash. The runtime
is a fake (the seam where runc cannot run unprivileged); the store is the real SQLite file.
"""

from __future__ import annotations

import dataclasses
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.framework.fakes import FakeAgent, FakeRuntime
from warren.config import Settings
from warren.orchestrator import SandboxManager, SandboxState
from warren.runtime.base import PauseMode, RuntimeKind, RuntimeState, SandboxHandle, SandboxSpec
from warren.store import (
    Database,
    EgressPolicy,
    HostRule,
    ImageConfig,
    IngressPolicy,
    LifecyclePolicy,
    OnTimeout,
    SandboxRepo,
    TemplateRepo,
    UpstreamProxy,
)
from warren.store.migrations import VERSION

FIXTURE = Path(__file__).parent / "fixtures" / "warren-v1.db"
HASH = "a566c8ef6b2a2583fe1c804cfb11d95ada60a6fac1446a30e374ee7c4e42b1d6"


class PausedRuntime(FakeRuntime):
    """The fake runtime, plus sandboxes that are paused when the node starts."""

    def __init__(self, agent: FakeAgent, paused: set[str]) -> None:
        super().__init__(RuntimeKind.RUNC, agent)
        self.paused = set(paused)
        self.resumed: list[tuple[str, PauseMode]] = []

    async def state(self, sandbox_id: str) -> RuntimeState | None:
        return RuntimeState.PAUSED if sandbox_id in self.paused else await super().state(sandbox_id)

    async def resume(self, spec: SandboxSpec, mode: PauseMode) -> SandboxHandle:
        self.paused.discard(spec.sandbox_id)
        self.resumed.append((spec.sandbox_id, mode))
        return await super().resume(spec, mode)


def _columns(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[1] for row in conn.execute("PRAGMA table_info(sandboxes)")]
    finally:
        conn.close()


def _copy(tmp_path: Path) -> Path:
    path = tmp_path / "warren.db"
    shutil.copy(FIXTURE, path)
    return path


async def test_old_records_read_as_typed_sub_records(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    assert "extra" in _columns(path)
    db = Database(path)
    try:
        records = {r.metadata["name"]: r for r in await SandboxRepo(db).all()}
    finally:
        db.close()
    assert "extra" not in _columns(path)
    mem, fs, run = records["paused-memory"], records["paused-filesystem"], records["running-from-snapshot"]
    image = ImageConfig(layers=("/l1",), env={"T": "1"}, workdir="/w", user="user")
    assert mem.image == fs.image == run.image == image
    assert mem.policy == LifecyclePolicy(on_timeout=OnTimeout.PAUSE, auto_resume=True, pause_memory=False)
    assert fs.policy == run.policy == LifecyclePolicy()
    assert mem.binding.pause_mode is PauseMode.MEMORY and fs.binding.pause_mode is PauseMode.FILESYSTEM
    assert run.binding.pause_mode is None
    assert {r.binding.runtime_hash for r in records.values()} == {HASH}
    assert run.origin is not None and run.origin.startswith("s") and mem.origin is None
    assert mem.env_vars == {"A": "1"} and mem.state == "paused"
    assert {r.ingress for r in records.values()} == {IngressPolicy()}  # older sandboxes are public


async def test_migrated_schema_equals_a_new_one_and_reopens(tmp_path: Path) -> None:
    old = _copy(tmp_path)
    Database(old).close()
    Database(old).close()  # a second open finds the current version: nothing to do
    fresh = tmp_path / "fresh.db"
    Database(fresh).close()
    assert _columns(old) == _columns(fresh)
    conn = sqlite3.connect(old)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == VERSION
    finally:
        conn.close()


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    Database(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {VERSION + 1}")
    conn.close()
    with pytest.raises(Exception, match="newer"):
        Database(path)


async def test_old_database_serves_its_paused_sandboxes(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    db = Database(path)
    agent = FakeAgent()
    await agent.start()
    try:
        ids = {r.metadata["name"]: r.id for r in await SandboxRepo(db).all()}
        runtime = PausedRuntime(agent, {ids["paused-memory"], ids["paused-filesystem"]})
        manager = SandboxManager(
            settings=Settings(state_dir=tmp_path, warm_pool_size=0),
            sandboxes=SandboxRepo(db),
            templates=TemplateRepo(db),
            runtimes={RuntimeKind.RUNC: runtime},
        )
        await manager.recover()
        # The running one has no runtime left behind it (the fixture's runtime is gone): dropped.
        assert manager.known_ids() == {ids["paused-memory"], ids["paused-filesystem"]}
        assert manager.get(ids["paused-memory"]).state == SandboxState.PAUSED

        address = await manager.wake(ids["paused-memory"])  # auto-resume, from the old record's policy
        assert address == "127.0.0.1" and manager.get(ids["paused-memory"]).state == SandboxState.RUNNING
        record, resumed = await manager.connect(ids["paused-filesystem"], None)
        assert resumed and record.state == SandboxState.RUNNING
        assert runtime.resumed == [
            (ids["paused-memory"], PauseMode.MEMORY),
            (ids["paused-filesystem"], PauseMode.FILESYSTEM),
        ]
        # A filesystem pause restarts the agent: /init again, from the old record's image and env.
        assert agent.inits[-1]["envVars"] == {"T": "1"} and agent.inits[-1]["defaultUser"] == "user"
        assert agent.inits[-1]["defaultWorkdir"] == "/w"
        stored = await SandboxRepo(db).get(ids["paused-filesystem"])
        assert stored is not None and stored.state == "running" and stored.binding.runtime_hash == HASH
    finally:
        await agent.close()
        db.close()


async def test_old_records_have_an_open_egress_policy_and_a_policy_round_trips(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    db = Database(path)
    try:
        repo = SandboxRepo(db)
        records = await repo.all()
        assert records and all(r.egress == EgressPolicy() and r.egress.is_open for r in records)
        policy = EgressPolicy(
            allow_out=("203.0.113.0/24", "*.example.com", "api.test"),
            deny_out=("0.0.0.0/0",),
            rules=(HostRule("api.test", (("Authorization", "Bearer s3cret"),)),),
            dns_servers=("1.1.1.1",),
            upstream=UpstreamProxy("p.test:1080", "u", "pw", True, None, None),
        )
        changed = dataclasses.replace(records[0], egress=policy)
        await repo.put(changed)
        stored = await repo.get(changed.id)
        assert stored is not None and stored.egress == policy and not policy.is_open
    finally:
        db.close()

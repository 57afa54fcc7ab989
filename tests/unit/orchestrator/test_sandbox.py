"""The Sandbox object: its state changes follow the table in states.py and are persisted first.

The record store is a fake (a seam: the real one is covered by tests/unit/store).
"""

from __future__ import annotations

import pytest

from warren.errors import InvalidStateError
from warren.orchestrator.faults import NO_FAULTS, FaultPoint, StallAt, faults_from_env
from warren.orchestrator.sandbox import Sandbox
from warren.orchestrator.states import SandboxState
from warren.runtime.base import RuntimeKind, SandboxHandle
from warren.store import SandboxRecord


class MemoryStore:
    def __init__(self, fail: bool = False) -> None:
        self.saved: list[SandboxRecord] = []
        self.fail = fail

    async def put(self, rec: SandboxRecord) -> None:
        if self.fail:
            raise OSError("disk full")
        self.saved.append(rec)

    async def delete(self, sandbox_id: str) -> bool:
        return True

    async def all(self) -> list[SandboxRecord]:
        return list(self.saved)


def _record(state: str = "creating") -> SandboxRecord:
    return SandboxRecord("i1", "t1", None, "runc", state, {}, {}, 0.0, 10.0, 1, 256, 1024, None, None, True)


async def test_state_changes_are_persisted_and_checked() -> None:
    store = MemoryStore()
    sandbox = Sandbox(_record(), store)
    await sandbox.set_state(SandboxState.RUNNING)
    assert sandbox.state is SandboxState.RUNNING and store.saved[-1].state == "running"
    with pytest.raises(InvalidStateError, match="running; cannot become resuming"):
        await sandbox.set_state(SandboxState.RESUMING)
    assert sandbox.state is SandboxState.RUNNING and len(store.saved) == 1


async def test_a_failed_save_leaves_the_record_unchanged() -> None:
    sandbox = Sandbox(_record(), MemoryStore(fail=True))
    with pytest.raises(OSError):
        await sandbox.set_state(SandboxState.RUNNING)
    assert sandbox.state is SandboxState.CREATING


async def test_bind_is_staged_until_the_next_save() -> None:
    store = MemoryStore()
    sandbox = Sandbox(_record(), store)
    sandbox.bind(SandboxHandle("i1", RuntimeKind.RUNC, "10.0.0.2", init_pid=42))
    assert store.saved == [] and sandbox.record.binding.init_pid == 42
    await sandbox.set_state(SandboxState.RUNNING)
    assert store.saved[-1].address == "10.0.0.2" and store.saved[-1].binding.init_pid == 42


async def test_fault_seam_is_inert_unless_asked() -> None:
    assert faults_from_env({}) is NO_FAULTS
    await NO_FAULTS.reached(FaultPoint.PAUSE)
    stall = faults_from_env({"WARREN_TEST_STALL": "resume"})
    assert isinstance(stall, StallAt) and stall.point is FaultPoint.RESUME
    await stall.reached(FaultPoint.PAUSE)  # another point: returns at once

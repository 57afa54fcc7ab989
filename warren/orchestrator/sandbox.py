"""One sandbox as the node holds it: its record, the lock its operations take, its state transitions.

Every change is persisted before it is visible: :meth:`Sandbox.save` writes the record to the store
(committed and fsynced in a worker thread, off the event loop) and only then replaces it in memory.
State changes go through the table in ``states.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Protocol

from ..errors import InvalidStateError
from ..runtime.base import RuntimeKind, SandboxHandle
from ..store import SandboxRecord
from .states import SandboxState, transition


class RecordStore(Protocol):
    """Where records are kept (``warren.store.SandboxRepo``)."""

    async def put(self, rec: SandboxRecord) -> None: ...

    async def delete(self, sandbox_id: str) -> bool: ...

    async def all(self) -> list[SandboxRecord]: ...


class Sandbox:
    def __init__(self, record: SandboxRecord, store: RecordStore) -> None:
        self._record = record
        self._store = store
        self.lock = asyncio.Lock()
        """Held by every operation that changes the sandbox; concurrent callers queue on it."""

    @property
    def record(self) -> SandboxRecord:
        return self._record

    @property
    def id(self) -> str:
        return self._record.id

    @property
    def state(self) -> SandboxState:
        return SandboxState(self._record.state)

    @property
    def kind(self) -> RuntimeKind:
        return RuntimeKind(self._record.runtime)

    async def save(self, record: SandboxRecord) -> None:
        await self._store.put(record)
        self._record = record

    async def update(self, **changes: Any) -> SandboxRecord:
        """Persist the record with ``changes`` (field names of :class:`SandboxRecord`)."""
        await self.save(dataclasses.replace(self._record, **changes))
        return self._record

    def stage(self, **changes: Any) -> None:
        """Change the in-memory record only; the next :meth:`save`, :meth:`update` or :meth:`set_state`
        persists it."""
        self._record = dataclasses.replace(self._record, **changes)

    async def set_state(self, target: SandboxState) -> None:
        transition(self.id, self.state, target)
        await self.update(state=target.value)

    def bind(self, handle: SandboxHandle) -> None:
        """Where the agent now is (staged; persisted with the next save)."""
        self.stage(address=handle.address, binding=dataclasses.replace(self._record.binding, init_pid=handle.init_pid))

    def require(self, *states: SandboxState) -> None:
        if self.state not in states:
            raise InvalidStateError(f"sandbox {self.id} is {self.state.value}")

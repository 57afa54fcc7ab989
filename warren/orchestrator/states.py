"""The sandbox lifecycle as data. Pure: no I/O.

    creating ──> running ──> pausing ──> paused ──> resuming ──> running
        │           │            │          │            │
        └───────────┴────────────┴──────────┴────────────┴──> killing ──> (record removed)

``pausing``/``resuming`` fall back to ``running``/``paused`` when the operation fails and can be undone.
"""

from __future__ import annotations

import enum

from ..errors import InvalidStateError


class SandboxState(enum.StrEnum):
    CREATING = "creating"  # host resources being made; not routable yet
    RUNNING = "running"  # agent answered /init; routable
    PAUSING = "pausing"  # being frozen or checkpointed; new traffic waits or is refused
    PAUSED = "paused"  # frozen or checkpointed; not consuming CPU
    RESUMING = "resuming"  # being thawed or restored
    KILLING = "killing"  # being torn down; the record goes when teardown ends


TRANSITIONS: dict[SandboxState, frozenset[SandboxState]] = {
    SandboxState.CREATING: frozenset({SandboxState.RUNNING, SandboxState.KILLING}),
    SandboxState.RUNNING: frozenset({SandboxState.PAUSING, SandboxState.KILLING}),
    SandboxState.PAUSING: frozenset({SandboxState.PAUSED, SandboxState.RUNNING, SandboxState.KILLING}),
    SandboxState.PAUSED: frozenset({SandboxState.RESUMING, SandboxState.KILLING}),
    SandboxState.RESUMING: frozenset({SandboxState.RUNNING, SandboxState.PAUSED, SandboxState.KILLING}),
    SandboxState.KILLING: frozenset(),
}


def transition(sandbox_id: str, current: SandboxState, target: SandboxState) -> SandboxState:
    """Return ``target`` if the table allows it, else raise ``InvalidStateError`` naming the state."""
    if target not in TRANSITIONS[current]:
        raise InvalidStateError(f"sandbox {sandbox_id} is {current.value}; cannot become {target.value}")
    return target


def public_state(state: SandboxState) -> str:
    """The E2B API knows only ``running`` and ``paused``."""
    return "paused" if state in (SandboxState.PAUSED, SandboxState.PAUSING) else "running"

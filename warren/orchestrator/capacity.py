"""The node's sandbox cap (E2B: concurrent sandboxes, 429) and the warm pool's share of it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..errors import TooManyRequestsError
from .pool import WarmPool
from .states import SandboxState
from .table import SandboxTable

_HOLDS_SLOT = frozenset({SandboxState.RUNNING, SandboxState.PAUSING})
"""States that hold a slot by themselves; creating and resuming sandboxes hold a reservation instead
(:meth:`Capacity.slot`), paused and killing ones none."""


class Capacity:
    def __init__(self, cap: int, table: SandboxTable) -> None:
        self.cap = cap
        """0: no cap."""
        self._table = table
        self._reserved = 0
        """Slots held by creates and resumes in progress."""
        self._pool: WarmPool | None = None

    def attach_pool(self, pool: WarmPool) -> None:
        self._pool = pool
        self._table.on_freed(pool.poke)

    def _spares(self) -> int:
        return self._pool.spares() if self._pool is not None else 0

    def active(self) -> int:
        """Sandboxes holding CPU and memory: running, pausing, and creates/resumes in progress."""
        return self._reserved + self._table.count_in(_HOLDS_SLOT)

    def limits(self) -> dict[str, int]:
        return {"active": self.active(), "max": self.cap, "spares": self._spares()}

    def check(self, wanted: int = 1, what: str = "") -> None:
        if self.cap and self.active() + wanted > self.cap:
            lead = f"{what} would exceed" if what else "You have reached"
            raise TooManyRequestsError(
                f"{lead} the maximum number of concurrent sandboxes on this node ({self.cap}). "
                "Kill or pause a sandbox first, or raise WARREN_MAX_SANDBOXES."
            )

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one slot for a create or resume (429 when none is free)."""
        self.check()
        self._reserved += 1
        try:
            yield
        finally:
            self._reserved -= 1
            self.freed()

    def freed(self) -> None:
        """A slot may be free: the pool may refill."""
        if self._pool is not None:
            self._pool.poke()

    def pool_room(self) -> bool:
        return not self.cap or self.active() + self._spares() < self.cap

    async def make_room(self) -> None:
        """Stop warm spares while they and the users' sandboxes exceed the cap (spares never block a create)."""
        while self.cap and self._pool is not None and self.active() + self._spares() > self.cap:
            if not await self._pool.evict_one():
                break

"""Warm pool: per template, N sandboxes already started and /init'ed, so a create is a claim.

A template joins the pool on its first create (no memory is spent on templates nobody uses).
Pool sandboxes are never in the store: a node that dies leaves them to the orphan reaper. Each is
/init'ed when it is started, with its template's env, user and workdir and a token of its own, so a
claim that adds no env vars takes it as it is (one record save); any other claim sends one more
``/init`` that presents that token and replaces it. On runc a spare also runs its template's start
command through its ready command before it is shelved (the launcher's starter does that).

Refills: each shelf refills in a task of its own, one spare at a time, and at most ``MAX_STARTING``
spares start at once on the node; a start can take seconds (a start command, its ready command), so a
slow or failing shelf holds back only itself. A failed start makes its shelf wait ``RETRY_AFTER_S``;
after ``MAX_FAILURES`` in a row the shelf stops refilling.

Node cap (``max_sandboxes``): the pool refills only while ``room()`` says a slot is free, counting its
spares (ready and starting) with the users' sandboxes; a create that finds no spare of its own
template may take a spare's slot (:meth:`WarmPool.evict_one`), so spares never block a create.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..errors import WarrenError
from ..runtime.base import RuntimeKind, SandboxHandle
from ..runtime.registry import StagedRuntime
from ..store import TemplateRecord
from .origin import Origin

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pooled:
    sandbox_id: str
    kind: RuntimeKind
    handle: SandboxHandle
    staged: StagedRuntime | None
    access_token: str
    """The token its agent was /init'ed with; the claiming sandbox keeps it or /init rotates it."""


@dataclass
class _Shelf:
    origin: Origin
    kind: RuntimeKind
    ready: list[Pooled] = field(default_factory=list)
    target: int = 0
    hits: int = 0
    misses: int = 0
    failures: int = 0
    refilling: bool = False
    """A start (or the wait after a failed one) is under way: a shelf refills one spare at a time."""


MAX_FAILURES = 3
"""Consecutive start failures after which a template's shelf stops refilling (a broken template)."""
MAX_STARTING = 2
"""Spares starting at once, node-wide: shelves refill side by side, and no more starts than this compete
with the users' creates for the host."""
RETRY_AFTER_S = 1.0
"""How long a shelf whose start failed waits before its next start (the other shelves do not wait)."""

Starter = Callable[[Origin, RuntimeKind], Awaitable[Pooled]]
Stopper = Callable[[Pooled], Awaitable[None]]
Room = Callable[[], bool]


class WarmPool:
    def __init__(self, start: Starter, stop: Stopper, *, default_size: int, room: Room = lambda: True) -> None:
        self._start = start
        self._stop = stop
        self._room = room
        self._starting = 0
        self.default_size = default_size
        self._shelves: dict[tuple[str, RuntimeKind], _Shelf] = {}
        self._sizes: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._closed = False
        self._stopping: dict[str, Pooled] = {}
        """Spares being stopped; a stop cut short by shutdown is finished by :meth:`drain`."""

    def set_size(self, template_id: str, size: int) -> None:
        """Per-template pool size (0 disables it for that template)."""
        self._sizes[template_id] = size
        for (tid, _), shelf in self._shelves.items():
            if tid == template_id:
                shelf.target = size
        self._wake.set()

    def want(self, template: TemplateRecord) -> None:
        """Make a template's shelf exist now (instead of at its first create)."""
        origin = Origin.of_template(template)
        key = (origin.template_id, RuntimeKind(origin.runtime))
        if key not in self._shelves:
            self._shelves[key] = _Shelf(origin, key[1], target=self._sizes.get(origin.template_id, self.default_size))
        self._wake.set()

    def claim(self, origin: Origin, kind: RuntimeKind) -> Pooled | None:
        """A ready sandbox for this template, or None (and the template now has a pool to refill)."""
        if self._closed or origin.snapshot_dir is not None:
            return None
        key = (origin.template_id, kind)
        shelf = self._shelves.get(key)
        if shelf is None:
            shelf = _Shelf(origin, kind, target=self._sizes.get(origin.template_id, self.default_size))
            self._shelves[key] = shelf
        self._wake.set()
        if shelf.ready:
            shelf.hits += 1
            return shelf.ready.pop(0)
        shelf.misses += 1
        return None

    def spares(self) -> int:
        """Pool sandboxes that hold resources: ready ones and ones being started."""
        return self._starting + sum(len(s.ready) for s in self._shelves.values())

    def poke(self) -> None:
        """A slot may have been freed: look again whether a shelf can be refilled."""
        self._wake.set()

    async def evict_one(self) -> bool:
        """Stop one ready spare (any template) to free its slot for a create; False if none is ready."""
        for shelf in self._shelves.values():
            if shelf.ready:
                await self._stop_quietly(shelf.ready.pop())
                return True
        return False

    def forget(self, template_id: str) -> None:
        """A template was deleted or replaced: stop refilling its shelves (drain() stops what is ready)."""
        for key in [k for k in self._shelves if k[0] == template_id]:
            self._shelves[key].target = 0
        self._wake.set()

    def stats(self) -> dict[str, dict[str, int]]:
        return {
            f"{tid}/{kind.value}": {"ready": len(s.ready), "target": s.target, "hits": s.hits, "misses": s.misses}
            for (tid, kind), s in self._shelves.items()
        }

    async def run(self) -> None:
        """Refill shelves for the node's lifetime, each in a task of this one's; trims shelves over target.
        Cancelled: the starts under way are cancelled (their starter stops what it made), then every
        spare is stopped."""
        try:
            async with asyncio.TaskGroup() as refills:
                while True:
                    self._wake.clear()
                    await self._trim()
                    self._refill_some(refills)
                    await self._wake.wait()
        finally:
            await asyncio.shield(self.drain())

    async def _trim(self) -> None:
        for shelf in list(self._shelves.values()):
            while len(shelf.ready) > shelf.target:
                await self._stop_quietly(shelf.ready.pop())  # tracked: a cancelled stop is redone

    def _refill_some(self, refills: asyncio.TaskGroup) -> None:
        """Start a refill for each shelf short of its target, while starts and the node's slots allow."""
        for shelf in list(self._shelves.values()):
            if self._starting >= MAX_STARTING:
                return
            short = not shelf.refilling and len(shelf.ready) < shelf.target
            if short and not self._closed and self._room():
                shelf.refilling = True
                self._starting += 1  # counted before the start: room() sees it at once
                refills.create_task(self._refill(shelf), name=f"warm-pool {shelf.origin.template_id}")

    async def _refill(self, shelf: _Shelf) -> None:
        """One spare for ``shelf``; after a failure the shelf waits, and gives up after ``MAX_FAILURES``."""
        try:
            try:
                pooled = await self._start(shelf.origin, shelf.kind)
            finally:
                self._starting -= 1
        except WarrenError as exc:
            self._failed(shelf, exc)
            await asyncio.sleep(RETRY_AFTER_S)
        else:
            shelf.failures = 0
            await self._shelve(shelf, pooled)
        finally:
            shelf.refilling = False
            self._wake.set()

    async def _shelve(self, shelf: _Shelf, pooled: Pooled) -> None:
        if self._room():
            shelf.ready.append(pooled)
        else:  # a create took this slot while the spare was starting
            await self._stop_quietly(pooled)

    def _failed(self, shelf: _Shelf, exc: WarrenError) -> None:
        shelf.failures += 1
        log.warning("warm pool for %s: start failed: %s", shelf.origin.template_id, exc)
        if shelf.failures >= MAX_FAILURES:
            log.error("warm pool for %s: giving up after %d failures", shelf.origin.template_id, shelf.failures)
            shelf.target = 0

    async def drain(self) -> None:
        """Stop every ready sandbox and finish interrupted stops (node shutdown). Idempotent."""
        self._closed = True
        for shelf in self._shelves.values():
            while shelf.ready:
                await self._stop_quietly(shelf.ready.pop())
        for pooled in list(self._stopping.values()):
            await self._stop_quietly(pooled)

    async def _stop_quietly(self, pooled: Pooled) -> None:
        self._stopping[pooled.sandbox_id] = pooled
        with contextlib.suppress(WarrenError):
            await self._stop(pooled)
        self._stopping.pop(pooled.sandbox_id, None)  # not reached when cancelled: drain() stops it again

"""A node's membership in the cluster: what it advertises, and the heartbeat that keeps it live.

The node (``warren.node``) owns one :class:`Heartbeat` task when it runs with ``--cluster-redis``.
Every ``interval_s`` it writes the node's :class:`NodeInfo` and sandbox roster into Redis with a TTL
(:meth:`ClusterStore.heartbeat`); a node whose record outlives no heartbeat is dead to the gateways.
Redis being away is logged once per outage and retried: the node keeps serving its own API meanwhile,
and re-registers by itself when Redis is back (empty or not).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from ..config import Settings
from ..errors import UnavailableError, WarrenError
from ..orchestrator import SandboxManager
from ..orchestrator.requests import ListQuery
from ..orchestrator.states import SandboxState, public_state
from ..runtime.registry import RuntimeRegistry
from ..snapshots import SnapshotRepository
from ..store import TemplateRepo
from .records import NodeInfo, SnapshotInfo, TemplateInfo
from .store import ClusterStore

log = logging.getLogger(__name__)

NODE_ID_FILE = "node-id"

Snapshot = Callable[[bool], Awaitable[tuple[NodeInfo, dict[str, str]]]]
"""``snapshot(draining)``: the node's record and roster now."""
AfterBeat = Callable[[ClusterStore, dict[str, str]], Awaitable[None]]
"""``after(store, roster)``: what the node does once its beat is in (:meth:`NodeServices.settle_moves`)."""


def node_id_of(settings: Settings) -> str:
    """``settings.node_id``, else the id generated once into the state dir (stable across restarts)."""
    if settings.node_id:
        return settings.node_id
    path = settings.state_dir / NODE_ID_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        node_id = f"{settings.node_name}-{secrets.token_hex(4)}"
        _write_once(path, node_id)
        return path.read_text().strip()


def _write_once(path: Path, text: str) -> None:
    try:
        with path.open("x") as f:
            f.write(text + "\n")
    except FileExistsError:
        pass


def advertise_url(settings: Settings, port: int, scheme: str = "http") -> str:
    """Where gateways reach this node: ``settings.advertise_url``, else the listen address (the host's
    name when the node listens on every interface)."""
    if settings.advertise_url:
        return settings.advertise_url.rstrip("/")
    host = settings.listen_host
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
        log.warning(
            "listening on every interface: advertising %s://%s:%d (set WARREN_ADVERTISE_URL)", scheme, host, port
        )
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


@dataclass
class NodeServices:
    """What a node's record is read from."""

    node_id: str
    url: str
    manager: SandboxManager
    templates: TemplateRepo
    snapshots: SnapshotRepository
    registry: RuntimeRegistry
    runtime_classes: Callable[[], tuple[str, ...]]
    started_at: float

    async def snapshot(self, draining: bool) -> tuple[NodeInfo, dict[str, str]]:
        records, _ = self.manager.list(ListQuery())
        roster = {r.id: public_state(SandboxState(r.state)) for r in records}
        limits = self.manager.limits()
        templates = tuple(TemplateInfo(t.id, t.name, t.runtime) for t in await self.templates.all())
        manifests = await asyncio.to_thread(self.snapshots.list)
        published = self.manager.mover.is_published
        snaps = tuple(
            SnapshotInfo(m.snapshot_id, tuple(m.names), m.runtime, m.runtime_hash, published(m.snapshot_id))
            for m in manifests
        )
        running = [r for r in records if roster[r.id] == "running"]
        info = NodeInfo(
            node_id=self.node_id,
            url=self.url,
            max_sandboxes=limits["max"],
            active=limits["active"],
            running=len(running),
            paused=len(records) - len(running),
            draining=draining,
            runtime_classes=self.runtime_classes(),
            runtime_hashes=tuple(self.registry.index.hashes()),
            templates=templates,
            snapshots=snaps,
            template_use=dict(Counter(r.template_id for r in records)),
            allocated_cpu=sum(r.cpu_count for r in running),
            allocated_memory_mb=sum(r.memory_mb for r in running),
            heartbeat_at=time.time(),
            started_at=self.started_at,
        )
        return info, roster

    async def settle_moves(self, store: ClusterStore, roster: dict[str, str]) -> None:
        """After a beat: release the paused sandboxes that moved to another node while this one was away
        or draining; when an admin drained this node, park what it has paused and not parked yet."""
        paused = [sid for sid, state in roster.items() if state == "paused"]
        for sandbox_id, node_id in (await store.bindings(paused)).items():
            if node_id is not None and node_id != self.node_id:
                try:
                    await self.manager.release(sandbox_id)
                except WarrenError as exc:
                    log.warning("could not release sandbox %s, which moved to node %s: %s", sandbox_id, node_id, exc)
        if self.manager.mover.enabled and await store.drained(self.node_id):
            await self.manager.mover.park_all()


class Heartbeat:
    """The node's membership task: :meth:`run` until cancelled, :meth:`leave` at shutdown."""

    def __init__(
        self, store: ClusterStore, node_id: str, snapshot: Snapshot, *, interval_s: float, ttl_s: float,
        after: AfterBeat | None = None,
    ) -> None:
        self._store = store
        self._after = after
        self.node_id = node_id
        self._snapshot = snapshot
        self._interval_s = interval_s
        self._ttl_s = ttl_s
        self.draining = False
        self._down = False
        self._wake = asyncio.Event()

    async def beat(self) -> None:
        info, roster = await self._snapshot(self.draining)
        # Reservations committed longer ago than two heartbeats are for sandboxes gone already.
        await self._store.heartbeat(info, roster, ttl_s=self._ttl_s, grace_s=max(2 * self._interval_s, 1.0))
        if self._after is not None:
            await self._after(self._store, roster)

    async def run(self) -> None:
        while True:
            try:
                await self.beat()
                if self._down:
                    log.info("cluster store reachable again; node re-registered")
                self._down = False
            except UnavailableError as exc:
                if not self._down:
                    log.warning("cluster heartbeat failed (retrying every %.1fs): %s", self._interval_s, exc)
                self._down = True
            except Exception:  # a bug here must not take the node down with it: its API serves on
                log.exception("cluster heartbeat failed unexpectedly; retrying")
                self._down = True
            self._wake.clear()
            try:
                async with asyncio.timeout(self._interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def poke(self) -> None:
        """Beat now (the node started draining)."""
        self._wake.set()

    async def leave(self) -> None:
        """The node stops: gateways stop sending it work at once (no TTL to wait out)."""
        try:
            self.draining = True
            await self.beat()
            await self._store.leave(self.node_id)
        except UnavailableError as exc:
            log.warning("could not leave the cluster cleanly (the TTL will): %s", exc)

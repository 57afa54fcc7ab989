"""Where a sandbox lives, for a gateway: bindings in Redis, node records read through a short cache."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ...errors import GoneError, NotFoundError, UnavailableError
from ..records import NodeView
from ..store import ClusterStore

_VIEW_TTL_S = 0.5
"""How long a gateway reuses the node records it read (placement re-reads capacity in Redis anyway)."""


class LostError(GoneError):
    """The sandbox was running on a node that died: it is gone (410)."""


class NodeDownError(UnavailableError):
    """The sandbox is paused on a node that is not live now; it comes back with the node (503)."""


@dataclass(frozen=True)
class Located:
    node: NodeView
    state: str | None
    """The sandbox's state in the node's last roster (None: not there yet, e.g. just created)."""


Probe = Callable[[NodeView, str], Awaitable[bool]]
"""``probe(node, sandbox_id)``: whether the node has the sandbox (asked of the node itself)."""


class Directory:
    def __init__(self, store: ClusterStore, probe: Probe | None = None) -> None:
        self.store = store
        self._probe = probe
        self._views: list[NodeView] = []
        self._read_at = float("-inf")

    async def nodes(self, *, fresh: bool = False) -> list[NodeView]:
        if fresh or time.monotonic() - self._read_at > _VIEW_TTL_S:
            self._views = await self.store.nodes()
            self._read_at = time.monotonic()
        return self._views

    async def node(self, node_id: str) -> NodeView | None:
        view = next((v for v in await self.nodes() if v.node_id == node_id), None)
        if view is None:
            view = next((v for v in await self.nodes(fresh=True) if v.node_id == node_id), None)
        return view

    async def locate(self, sandbox_id: str) -> Located:
        """The node bound to ``sandbox_id`` (any state); 404 when no node has it."""
        node_id = await self.store.binding(sandbox_id) or await self._ask_nodes(sandbox_id)
        if node_id is None:
            raise NotFoundError(f"sandbox {sandbox_id} not found")
        view = await self.node(node_id)
        if view is None:
            raise NotFoundError(f"sandbox {sandbox_id} not found")
        state = None if view.alive else (await self.store.roster(node_id)).get(sandbox_id)
        return Located(view, state)

    async def _ask_nodes(self, sandbox_id: str) -> str | None:
        """No binding (a sandbox made on a node directly, e.g. forked through its own API, and not in a
        heartbeat yet): the live nodes are asked, and the one that has it is bound."""
        if self._probe is None:
            return None
        live = [v for v in await self.nodes() if v.alive]
        found = await asyncio.gather(*(self._probe(v, sandbox_id) for v in live))
        for view, has in zip(live, found, strict=True):
            if has:
                await self.store.bind(sandbox_id, view.node_id)
                return view.node_id
        return None

    async def live(self, sandbox_id: str) -> NodeView:
        """The live node that has ``sandbox_id``; 410 if it died with it, 503 if it waits for its node."""
        found = await self.locate(sandbox_id)
        if found.node.alive:
            return found.node
        if found.state == "paused":
            raise NodeDownError(
                f"sandbox {sandbox_id} is paused on node {found.node.node_id}, which is down; it is back with the node"
            )
        raise LostError(
            f"sandbox {sandbox_id} is lost: it was running on node {found.node.node_id}, which stopped heartbeating"
        )

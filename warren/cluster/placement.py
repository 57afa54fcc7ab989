"""Placement: which nodes may take a create (filter), and in which order to try them (a strategy).

Pure: no I/O. The gateway reads the nodes from Redis, ranks them here, then reserves a slot on the
first that still has one (atomically, in Redis: :meth:`ClusterStore.reserve`).

Filter, in order:

1. live (heartbeat within its TTL) and not draining;
2. what the create names: a snapshot must be on the node (or in the shared store, which any node
   reaches) and its runtime hash in the node's runtime index (seed 003: a restore goes only where its
   runtime can be staged, else 409 naming the hash);
   a template (``name:tag``: its ``name``) must be on the node and its sandbox class available there;
   a name no heartbeat lists yet goes to the node a build through a gateway made it on (Redis), and a
   name no node knows to any node (whose answer, a 404, is the right one);
3. capacity: a node at its cap (active sandboxes plus reservations) is skipped; all at cap is a 429.

The strategy orders what is left. :class:`LeastLoaded` (the default) prefers the lowest share of the
node's cap in use, then template locality (sandboxes of the same template already there), and breaks
ties at random so that equal nodes share the creates.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..errors import ConflictError, TooManyRequestsError, UnavailableError
from .records import NodeView


@dataclass(frozen=True)
class PlacementRequest:
    ref: str
    """The create's ``templateID``: a template id or name (``name:tag`` too), or a snapshot id or name."""
    built_on: str | None = None
    """The node a build through a gateway made the template on (Redis), for a name no heartbeat lists yet."""

    @property
    def template(self) -> str:
        """``ref`` without a ``:tag``: the template the node record lists (tags live with its builds)."""
        return self.ref.partition(":")[0]


class Strategy(Protocol):
    def rank(self, request: PlacementRequest, candidates: Sequence[NodeView]) -> list[NodeView]:
        """``candidates`` (all eligible, none full) in the order to try them."""
        ...


class LeastLoaded:
    """Lowest load fraction first; template locality breaks near-ties; random among equals."""

    LOCALITY_WEIGHT = 0.05
    """How much one share of a node's cap is worth against having the template's sandboxes there already."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def rank(self, request: PlacementRequest, candidates: Sequence[NodeView]) -> list[NodeView]:
        def score(view: NodeView) -> tuple[float, float]:
            cap = view.info.max_sandboxes
            load = view.load / cap if cap > 0 else view.load / 1000
            template = view.info.template(request.template)
            local = template is not None and view.info.template_use.get(template.id, 0) > 0
            return (load - (self.LOCALITY_WEIGHT if local else 0.0), self._rng.random())

        return sorted(candidates, key=score)


def _serves(view: NodeView, request: PlacementRequest) -> bool:
    template = view.info.template(request.template)
    return template is not None and template.runtime in view.info.runtime_classes


def eligible(request: PlacementRequest, nodes: Sequence[NodeView]) -> list[NodeView]:
    """Steps 1 and 2 of the filter; raises when no node can ever serve the request."""
    live = [v for v in nodes if v.alive and not v.draining]
    if not live:
        raise UnavailableError("no live node in the cluster can take new sandboxes")
    holders = [v for v in live if v.info.snapshot(request.ref) is not None]
    shared = next((s for v in nodes if (s := v.info.snapshot(request.ref)) is not None and s.shared), None)
    if shared is not None:  # in the shared store: any live node with its runtime can pull it
        holders = live
    if holders:
        hashes = {s.runtime_hash for v in holders if (s := v.info.snapshot(request.ref) or shared) is not None}
        able = [
            v for v in holders
            if (s := v.info.snapshot(request.ref) or shared) is not None
            and (s.runtime_hash is None or s.runtime_hash in v.info.runtime_hashes)
        ]  # fmt: skip
        if not able:
            named = ", ".join(sorted(h for h in hashes if h))
            raise ConflictError(f"no live node has runtime {named} that snapshot {request.ref!r} needs")
        return able
    knowing = [v for v in live if v.info.template(request.template) is not None]
    if knowing:
        able = [v for v in knowing if _serves(v, request)]
        if not able:
            raise UnavailableError(f"no live node can run template {request.ref!r}: its runtime is unavailable")
        return able
    if any(v.info.template(request.template) or v.info.snapshot(request.ref) for v in nodes):
        raise UnavailableError(f"template {request.ref!r} is only on nodes that are dead or draining")
    builder = [v for v in live if v.node_id == request.built_on]
    return builder or live


def place(request: PlacementRequest, nodes: Sequence[NodeView], strategy: Strategy) -> list[NodeView]:
    """The nodes to try, best first; raises 409/429/503 when there is none."""
    candidates = eligible(request, nodes)
    free = [v for v in candidates if v.info.max_sandboxes <= 0 or v.load < v.info.max_sandboxes]
    if not free:
        raise TooManyRequestsError(
            f"every node that can run {request.ref!r} is at its sandbox cap ({len(candidates)} nodes)"
        )
    return strategy.rank(request, free)

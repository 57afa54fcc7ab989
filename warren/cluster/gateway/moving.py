"""Resumes that move a paused sandbox to another node (the shared snapshot store holds its copy).

A resume or connect of a sandbox that is paused on a node that is dead, stopped or draining moves it:

1. one gateway claims the move in Redis (:meth:`ClusterStore.claim_move`); another that asks meanwhile
   waits for the binding to change, then follows it;
2. the live, non-draining nodes other than its own are ranked by the placement strategy; on each in
   turn a slot is reserved and the node is asked to adopt the sandbox (``POST
   /warren/sandboxes/{id}/adopt``): it pulls the copy and holds the sandbox as paused. A node that lacks
   the sandbox's template or runtime hash answers 409 naming it, and the next one is asked;
3. the binding moves to the adopting node (the reservation's commit), the old node's roster loses the
   sandbox, and the old node, when it is live, is told to release its copy (a node that comes back
   later releases it by itself: :mod:`warren.cluster.membership`).

The resume itself is then forwarded to the new node as it came. No copy in the store (the node had
no shared store, or the copy was not uploaded yet) is not a move: the caller goes on as before (503
while the node is down; a draining node resumes it itself).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Sequence

from starlette.requests import Request

from ...errors import ConflictError, UnavailableError
from ..placement import PlacementRequest
from ..records import NodeView
from .directory import Directory
from .upstream import NodeClient, passed_headers

log = logging.getLogger(__name__)

MOVE_HOLD_S = 300.0
"""How long a move's claim and slot hold when the gateway dies mid-move (a pull can take a while)."""
_FOLLOW_S = 300.0
_WAKING = re.compile(r"^(/v2)?/sandboxes/[^/]+/(resume|connect)/?$")

RankFn = Callable[[PlacementRequest, Sequence[NodeView]], list[NodeView]]
"""The placement strategy's ``rank``."""


def wakes(request: Request) -> bool:
    """Whether the call resumes the sandbox: ``POST [/v2]/sandboxes/{id}/resume`` or ``/connect``."""
    return request.method == "POST" and _WAKING.match(request.url.path) is not None


async def stranded_on(request: Request, directory: Directory, client: NodeClient, sandbox_id: str) -> NodeView | None:
    """The node a paused sandbox waits on when that node cannot resume it now (dead, stopped or
    draining); None when it is not paused there, or its node is ready. A live node is asked for the
    sandbox's state; a dead one's last roster may predate the pause, so any sandbox of it is a
    candidate (:func:`move` finds no copy of one that was running: it is lost)."""
    found = await directory.locate(sandbox_id)
    node = found.node
    if node.alive and not node.draining:
        return None
    if not node.alive:  # paused, or "running" in a roster older than its pause: a parked copy tells
        return node if found.state in ("paused", "running") else None
    try:
        answer = await client.call(node.info.url, "GET", f"/sandboxes/{sandbox_id}", headers=passed_headers(request))
    except UnavailableError:
        return None
    state = answer.json().get("state") if answer.status_code == 200 else None
    return node if state == "paused" else None


async def move(request: Request, directory: Directory, client: NodeClient, strategy_rank: RankFn,
               sandbox_id: str, source: NodeView) -> NodeView | None:  # fmt: skip
    """Move the paused ``sandbox_id`` off ``source``; the node that holds it now, or None when there is
    no copy to move. 409 when no node can run it (the nodes' reasons, naming the hash or template)."""
    store = directory.store
    token = await store.claim_move(sandbox_id, hold_s=MOVE_HOLD_S)
    if token is None:
        return await _follow(directory, sandbox_id, source)
    try:
        nodes = await directory.nodes(fresh=True)
        candidates = [
            v for v in nodes
            if v.alive and not v.draining and v.node_id != source.node_id
            and (v.info.max_sandboxes <= 0 or v.load < v.info.max_sandboxes)
        ]  # fmt: skip
        refusals: list[str] = []
        conflicts = 0
        for view in strategy_rank(PlacementRequest(sandbox_id), candidates):
            held = await store.reserve(view.node_id, hold_s=MOVE_HOLD_S)
            if isinstance(held, str):
                refusals.append(f"{view.node_id}: {held}")
                continue
            try:
                answer = await client.call(
                    view.info.url, "POST", f"/warren/sandboxes/{sandbox_id}/adopt", headers=passed_headers(request)
                )
            except UnavailableError as exc:
                await store.release(held)
                refusals.append(f"{view.node_id}: {exc}")
                continue
            if answer.status_code == 201:
                await store.commit(held, sandbox_id, hold_s=MOVE_HOLD_S)
                await store.unbind(sandbox_id, source.node_id)  # drops it from the old node's roster
                if source.alive:
                    await _release(request, client, source, sandbox_id)
                log.info("moved paused sandbox %s from node %s to node %s", sandbox_id, source.node_id, view.node_id)
                return view
            await store.release(held)
            if answer.status_code == 404:
                return None  # no copy in the shared store: it cannot move
            conflicts += answer.status_code == 409
            refusals.append(f"{view.node_id}: {_message(answer.text)}")
        if refusals and conflicts == len(refusals):
            raise ConflictError(f"no node can resume sandbox {sandbox_id}: {'; '.join(refusals)}")
        if not refusals:
            raise UnavailableError(f"no other live node can take sandbox {sandbox_id} now")
        raise UnavailableError(f"no node took sandbox {sandbox_id}: {'; '.join(refusals)}")
    finally:
        await store.end_move(sandbox_id, token)


async def _follow(directory: Directory, sandbox_id: str, source: NodeView) -> NodeView | None:
    """Another gateway moves it: wait until its binding leaves ``source`` (or the claim ends)."""
    deadline = time.monotonic() + _FOLLOW_S
    while time.monotonic() < deadline:
        bound = await directory.store.binding(sandbox_id)
        if bound is not None and bound != source.node_id:
            return await directory.node(bound)
        if await directory.store.claim_move(sandbox_id, hold_s=0.001) is not None:
            return None  # the other gateway gave up; the caller answers as for no move
        await asyncio.sleep(0.1)
    raise UnavailableError(f"sandbox {sandbox_id} is being moved to another node; try again")


async def _release(request: Request, client: NodeClient, source: NodeView, sandbox_id: str) -> None:
    try:
        answer = await client.call(
            source.info.url, "POST", f"/warren/sandboxes/{sandbox_id}/release", headers=passed_headers(request)
        )
        if answer.status_code not in (204, 404):
            log.warning("node %s kept its copy of moved sandbox %s: %s", source.node_id, sandbox_id, answer.text)
    except UnavailableError as exc:  # it releases it by itself at its next heartbeat
        log.warning("could not tell node %s to release moved sandbox %s: %s", source.node_id, sandbox_id, exc)


def _message(text: str) -> str:
    try:
        doc = json.loads(text)
    except ValueError:
        return text[:200]
    return str(doc.get("message", text))[:300] if isinstance(doc, dict) else text[:200]

"""``GET /sandboxes`` and ``GET /v2/sandboxes`` across the cluster: every live node asked at once, pages
merged in the nodes' own order (start time, then id: newest first, or oldest with ``order=asc``).

The gateway's ``nextToken`` is one position in that order, valid on every node: each node is asked for
what comes after a point just short of it (the listed start times have microseconds, the nodes' have
more), and the gateway drops what does not come after the position itself. A node that is dead or does not
answer leaves the others' results standing: the answer is partial and says so in
``X-Warren-Partial`` (the nodes missing), never a failed list.
"""

from __future__ import annotations

import asyncio
import base64
import calendar
import json
import time
from dataclasses import dataclass

from starlette.requests import Request

from ...api.models import parse_list_query
from ...errors import InvalidRequestError, UnavailableError
from ...orchestrator.requests import Order
from ...orchestrator.table import encode_list_token
from ..records import NodeView
from .upstream import NodeClient, passed_headers

PARTIAL_HEADER = "X-Warren-Partial"
_EPSILON_S = 2e-6


@dataclass(frozen=True)
class Page:
    items: list[dict[str, object]]
    next_token: str | None
    missing: list[str]
    """Nodes whose sandboxes are not in the page: dead, or not answering."""


def _position(item: dict[str, object]) -> tuple[str, str]:
    return str(item.get("startedAt", "")), str(item.get("sandboxID", ""))


def _encode(position: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(position)).encode()).decode()


def _decode(token: str) -> tuple[str, str]:
    try:
        started, sandbox_id = json.loads(base64.urlsafe_b64decode(token.encode()))
        _seconds(str(started))
        return str(started), str(sandbox_id)
    except (ValueError, TypeError, UnicodeDecodeError):
        raise InvalidRequestError("invalid nextToken") from None


def _seconds(rfc3339: str) -> float:
    """``2026-12-01T16:04:35.123456Z`` as seconds since the epoch."""
    whole, _, frac = rfc3339.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + (float(f"0.{frac}") if frac else 0.0)


async def list_cluster(request: Request, nodes: list[NodeView], client: NodeClient) -> Page:
    params = dict(request.query_params)
    query = parse_list_query(params)  # the nodes' own validation: a bad query is a 400 here too
    after = _decode(query.next_token) if query.next_token else None
    node_params = [(k, v) for k, v in request.query_params.multi_items() if k not in ("limit", "nextToken")]
    if query.limit is not None:
        node_params.append(("limit", str(query.limit + 2)))
    descending = query.order is Order.DESC
    if after is not None:
        # Just past the position in the query's order, so the node's page starts at or before it.
        nudge = _EPSILON_S if descending else -_EPSILON_S
        node_params.append(("nextToken", encode_list_token(_seconds(after[0]) + nudge, after[1])))
    live = [v for v in nodes if v.alive]
    missing = [v.node_id for v in nodes if not v.alive and v.roster_size > 0]
    headers = passed_headers(request)

    async def ask(view: NodeView) -> tuple[list[dict[str, object]], bool] | None:
        try:
            answer = await client.call(view.info.url, "GET", request.url.path, headers=headers, params=node_params)
        except UnavailableError:
            return None
        if answer.status_code != 200:
            return None
        return list(answer.json()), "x-next-token" in answer.headers

    results = await asyncio.gather(*(ask(v) for v in live))
    items: list[dict[str, object]] = []
    more = False
    for view, result in zip(live, results, strict=True):
        if result is None:
            missing.append(view.node_id)
            continue
        items += result[0]
        more = more or result[1]
    if after is not None:
        items = [i for i in items if (_position(i) < after if descending else _position(i) > after)]
    items.sort(key=_position, reverse=descending)
    next_token = None
    if query.limit is not None and (len(items) > query.limit or more):
        items = items[: query.limit]
        if items:
            next_token = _encode(_position(items[-1]))
    return Page(items, next_token, sorted(missing))

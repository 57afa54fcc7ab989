"""The gateway's control plane: E2B routes placed or routed to nodes, lists merged, ``/nodes`` from Redis.

* ``POST /sandboxes``: placement (:mod:`warren.cluster.placement`), a slot reserved in Redis, then the
  create on that node; a node that answers 429 or 503 (its cap, or it started draining) gives the
  create to the next candidate.
* Calls on one sandbox go to the node bound to it; a node that no longer has it (a 404 to
  ``GET``/``DELETE /sandboxes/{id}``) loses the binding.
* Lists merge every live node's (:mod:`.listing`); ``/nodes`` and ``/nodes/{id}`` read Redis only.
* ``/metrics``: Prometheus (:mod:`.metrics`); each route's ``name`` is its class there.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...api.errors import error_response
from ...api.metrics import exposition, metrics_allowed
from ...api.models import parse_json_object
from ...errors import ConflictError, InvalidRequestError, NotFoundError, TooManyRequestsError, UnavailableError
from ..placement import PlacementRequest, Strategy, place
from . import builds, fanout
from .directory import Directory
from .listing import PARTIAL_HEADER, list_cluster
from .metrics import GatewayMetrics, PlacementFailure
from .moving import move, stranded_on, wakes
from .upstream import NodeClient, passed_headers, relay

log = logging.getLogger(__name__)

RESERVATION_HOLD_S = 600.0
"""How long a create's reservation holds when its gateway dies mid-create (a create can pull images)."""


@dataclass
class Gateway:
    directory: Directory
    client: NodeClient
    strategy: Strategy
    max_upload_bytes: int = 4 << 30
    """The largest template-build upload relayed to a node (a node's own default limit)."""
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    metrics_key: str | None = None
    """The key a scrape of ``/metrics`` must send; None: anyone may scrape."""
    domain: str | None = None
    """The gateway's ``--domain``: put into every sandbox answer (:func:`sandbox_answer`)."""
    tls_ca: Path | None = None
    """The CA the gateway made for its domain (named in ``/health``); None: none made."""


def gateway_of(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


def _with_domain(value: Any, domain: str) -> Any:
    """``value`` with ``domain`` in every sandbox object in it (one with ``sandboxID`` and ``domain``)."""
    if isinstance(value, list):
        return [_with_domain(item, domain) for item in value]
    if isinstance(value, dict):
        out = {k: _with_domain(v, domain) for k, v in value.items()}
        if "sandboxID" in out and "domain" in out:
            out["domain"] = domain
        return out
    return value


def sandbox_answer(gw: Gateway, answer: httpx.Response) -> Response:
    """A node's answer about sandboxes, back to the client: with the gateway's domain, when it has one.

    The nodes behind a gateway stay in header mode and answer their own ``domain`` (the header-mode
    placeholder); the SDK builds ``https://<port>-<id>.<domain>`` from it, so in domain mode it must name
    the gateway's domain. Create, connect, resume, get and fork answers all come through here."""
    if gw.domain is None or not answer.headers.get("content-type", "").startswith("application/json"):
        return relay(answer)
    try:
        body = answer.json()
    except ValueError:
        return relay(answer)
    rewritten = _with_domain(body, gw.domain)
    return relay(answer) if rewritten == body else relay(answer, json.dumps(rewritten, separators=(",", ":")).encode())


async def create(request: Request) -> Response:
    gw = gateway_of(request)
    body = await request.body()
    template = parse_json_object(body, allow_empty=False).get("templateID")
    if not isinstance(template, str) or not template:
        raise InvalidRequestError("templateID is required")
    nodes = await gw.directory.nodes(fresh=True)
    wanted = PlacementRequest(template, built_on=await gw.directory.store.template_node(template.partition(":")[0]))
    try:
        candidates = place(wanted, nodes, gw.strategy)
    except TooManyRequestsError:
        gw.metrics.placement_failed(PlacementFailure.FULL)
        raise
    except ConflictError:
        gw.metrics.placement_failed(PlacementFailure.NO_RUNTIME)
        raise
    except UnavailableError:
        gw.metrics.placement_failed(PlacementFailure.NO_CANDIDATE)
        raise
    known = any(v.info.template(wanted.template) or v.info.snapshot(template) for v in nodes)
    refusals: list[str] = []
    for view in candidates:
        held = await gw.directory.store.reserve(view.node_id, hold_s=RESERVATION_HOLD_S)
        if isinstance(held, str):
            refusals.append(f"{view.node_id}: {held}")
            continue
        try:
            answer = await gw.client.forward(view.info.url, request, body)
        except UnavailableError as exc:
            await gw.directory.store.release(held)
            refusals.append(f"{view.node_id}: {exc}")
            continue
        if answer.status_code == 201:
            sandbox_id = str(answer.json()["sandboxID"])
            await gw.directory.store.commit(held, sandbox_id, hold_s=RESERVATION_HOLD_S)
            return sandbox_answer(gw, answer)
        await gw.directory.store.release(held)
        if answer.status_code in (429, 503) or (answer.status_code == 404 and not known and view is not candidates[-1]):
            # A cap or a drain the heartbeat did not show yet; or a name no heartbeat had (a snapshot
            # taken a moment ago): the next node may take it.
            refusals.append(f"{view.node_id}: {answer.status_code}")
            continue
        return relay(answer)
    if refusals and all(r.endswith(("full", "429")) for r in refusals):
        gw.metrics.placement_failed(PlacementFailure.FULL)
        raise TooManyRequestsError(f"every node that can run {template!r} is at its sandbox cap")
    gw.metrics.placement_failed(PlacementFailure.REFUSED)
    raise UnavailableError(f"no node took the sandbox: {'; '.join(refusals)}")


async def list_sandboxes(request: Request) -> Response:
    gw = gateway_of(request)
    page = await list_cluster(request, await gw.directory.nodes(), gw.client)
    headers = {"x-next-token": page.next_token} if page.next_token else {}
    if page.missing:
        headers[PARTIAL_HEADER] = ",".join(page.missing)
    return JSONResponse(page.items, headers=headers)


async def batch_metrics(request: Request) -> Response:
    """``GET /sandboxes/metrics?sandbox_ids=a,b``: each node asked for its own, the answers merged.

    A sandbox no live node has is left out, as a node leaves out one it does not know."""
    gw = gateway_of(request)
    raw = ",".join(request.query_params.getlist("sandbox_ids"))
    ids = list(dict.fromkeys(i.strip() for i in raw.split(",") if i.strip()))
    if not ids:
        raise InvalidRequestError("sandbox_ids is required: a comma-separated list of sandbox ids")
    by_node: dict[str, list[str]] = {}
    for sandbox_id in ids:
        node_id = await gw.directory.store.binding(sandbox_id)
        if node_id is not None:
            by_node.setdefault(node_id, []).append(sandbox_id)
    merged: dict[str, object] = {}
    for node_id, some in by_node.items():
        view = await gw.directory.node(node_id)
        if view is None or not view.alive:
            continue
        answer = await gw.client.call(
            view.info.url, "GET", "/sandboxes/metrics", headers=passed_headers(request),
            params=[("sandbox_ids", ",".join(some))],
        )  # fmt: skip
        if answer.status_code != 200:
            return relay(answer)
        merged.update(answer.json().get("sandboxes", {}))
    return JSONResponse({"sandboxes": merged})


async def on_sandbox(request: Request) -> Response:
    """Any call on one sandbox: to its node, as it came."""
    gw = gateway_of(request)
    sandbox_id = request.path_params["sandbox_id"]
    body = await request.body()
    view = None
    if request.method == "DELETE":
        found = await gw.directory.locate(sandbox_id)
        if not found.node.alive:  # paused on a dead node: its copy in the shared store goes with a kill there
            view = await move(request, gw.directory, gw.client, gw.strategy.rank, sandbox_id, found.node)
            if view is None and found.state != "paused":
                await gw.directory.store.unbind(sandbox_id, found.node.node_id)  # a lost sandbox: forgotten
                return Response(status_code=204)
    if wakes(request) and (source := await stranded_on(request, gw.directory, gw.client, sandbox_id)) is not None:
        view = await move(request, gw.directory, gw.client, gw.strategy.rank, sandbox_id, source)
    if view is None:
        view = await gw.directory.live(sandbox_id)
    answer = await gw.client.forward(view.info.url, request, body)
    on_itself = request.url.path.rstrip("/") == f"/sandboxes/{sandbox_id}"  # not a route the node lacks
    if on_itself and (answer.status_code == 404 or (request.method == "DELETE" and answer.status_code == 204)):
        await gw.directory.store.unbind(sandbox_id, view.node_id)
    elif request.url.path.endswith("/fork") and answer.status_code == 201:
        for item in answer.json():
            if isinstance(item, dict) and isinstance(item.get("sandbox"), dict):
                await gw.directory.store.bind(str(item["sandbox"]["sandboxID"]), view.node_id)
    return sandbox_answer(gw, answer)


async def merged(request: Request) -> Response:
    """A list every live node answers in part (snapshots, templates): the parts, concatenated."""
    gw = gateway_of(request)
    out: list[object] = []
    missing = []
    for view in await gw.directory.nodes():
        if not view.alive:
            if view.roster_size:
                missing.append(view.node_id)
            continue
        try:
            answer = await gw.client.forward(view.info.url, request, b"")
        except UnavailableError:
            missing.append(view.node_id)
            continue
        if answer.status_code != 200:
            return relay(answer)
        out += answer.json()
    return JSONResponse(out, headers={PARTIAL_HEADER: ",".join(missing)} if missing else None)


async def on_holder(request: Request) -> Response:
    """A snapshot or template by id or name: to the live nodes that hold it (a delete: to each of them)."""
    gw = gateway_of(request)
    ref = request.path_params["ref"]
    holders = [
        v for v in await gw.directory.nodes(fresh=True)
        if v.alive and (v.info.snapshot(ref) is not None or v.info.template(ref) is not None)
    ]  # fmt: skip
    if not holders:
        raise NotFoundError(f"template or snapshot {ref} not found")
    body = await request.body()
    answers = [
        await gw.client.forward(v.info.url, request, body) for v in holders[: 1 if request.method == "GET" else None]
    ]
    return relay(next((a for a in answers if a.status_code < 300), answers[-1]))


async def list_nodes(request: Request) -> Response:
    views = await gateway_of(request).directory.nodes(fresh=True)
    return JSONResponse([v.body() for v in views])


async def get_node(request: Request) -> Response:
    gw = gateway_of(request)
    view = await gw.directory.node(request.path_params["node_id"])
    if view is None:
        raise NotFoundError(f"node {request.path_params['node_id']} not found")
    return JSONResponse(view.body(await gw.directory.store.roster(view.node_id)))


async def set_node_status(request: Request) -> Response:
    """E2B's node status change: ``{"status": "draining"}`` places nothing new there, ``"ready"`` lifts it."""
    gw = gateway_of(request)
    node_id = request.path_params["node_id"]
    status = parse_json_object(await request.body(), allow_empty=False).get("status")
    if status not in ("draining", "ready"):
        raise InvalidRequestError("status must be 'draining' or 'ready'")
    if await gw.directory.node(node_id) is None:
        raise NotFoundError(f"node {node_id} not found")
    await gw.directory.store.set_drain(node_id, status == "draining")
    return Response(status_code=204)


async def health(request: Request) -> Response:
    gw = gateway_of(request)
    ok = await gw.directory.store.ping()
    body: dict[str, object] = {"status": "ok" if ok else "degraded", "role": "gateway", "redis": "up" if ok else "down"}
    body["domain"] = gw.domain
    if gw.tls_ca is not None:
        body["tlsCA"] = str(gw.tls_ca)
    return JSONResponse(body, status_code=200 if ok else 503)


async def metrics(request: Request) -> Response:
    """Prometheus's text format; the nodes gauge read from Redis now (absent when Redis is away)."""
    gw = gateway_of(request)
    if not metrics_allowed(request.headers, gw.metrics_key or "", gw.metrics_key is None):
        return error_response(401, "the metrics need the API key: send X-API-Key or Authorization: Bearer")
    try:
        views = await gw.directory.nodes(fresh=True)
    except UnavailableError:
        views = None  # counted as a Redis error by the store
    gw.metrics.nodes_seen(views)
    return exposition(gw.metrics.registry)


ROUTES = [  # name: the route's class in warren_gateway_requests_total (metrics.py)
    Route("/health", health, methods=["GET"], name="health"),
    Route("/metrics", metrics, methods=["GET"], name="metrics"),
    Route("/sandboxes", create, methods=["POST"], name="create"),
    Route("/v2/sandboxes", create, methods=["POST"], name="create"),
    Route("/sandboxes", list_sandboxes, methods=["GET"], name="list"),
    Route("/v2/sandboxes", list_sandboxes, methods=["GET"], name="list"),
    Route("/sandboxes/metrics", batch_metrics, methods=["GET"], name="list"),  # before /sandboxes/{sandbox_id}
    Route("/sandboxes/{sandbox_id}", on_sandbox, methods=["GET", "DELETE"], name="sandbox"),
    Route("/sandboxes/{sandbox_id}/{action:path}", on_sandbox, methods=["GET", "POST", "PUT"], name="sandbox"),
    Route("/v2/sandboxes/{sandbox_id}/{action:path}", on_sandbox, methods=["GET", "POST"], name="sandbox"),
    Route("/snapshots", merged, methods=["GET"], name="list"),
    Route("/templates", merged, methods=["GET"], name="list"),
    Route("/v2/templates", merged, methods=["GET"], name="list"),
    Route("/snapshots/{ref}", on_holder, methods=["GET", "DELETE"], name="holder"),
    # Template builds and tags (builds.py): one node per build, remembered in Redis.
    Route("/templates/tags", builds.change_tags, methods=["POST", "DELETE"], name="build"),  # before /templates/{ref}
    Route("/templates/{template_id}/tags", builds.on_template, methods=["GET"], name="build"),
    Route("/v3/templates", builds.request_build, methods=["POST"], name="build"),
    Route("/templates/aliases/{alias}", builds.on_template, methods=["GET"], name="build"),
    Route("/templates/{template_id}/files/{filesHash}", builds.files_link, methods=["GET"], name="build"),
    Route("/warren/uploads/{template_id}/{filesHash}", builds.upload_files, methods=["PUT"], name="build"),
    Route("/v2/templates/{template_id}/builds/{buildID}", builds.start_build, methods=["POST"], name="build"),
    Route("/templates/{template_id}/builds/{buildID}/status", builds.on_template, methods=["GET"], name="build"),
    Route("/templates/{ref}", builds.template_by_ref, methods=["GET", "DELETE"], name="holder"),
    # Per-node operations (fanout.py): on every live node.
    Route("/warren/templates/import", fanout.on_every_node, methods=["POST"], name="admin"),
    Route("/warren/templates/ensure", fanout.on_every_node, methods=["POST"], name="admin"),
    Route("/warren/templates/{template_id}/pool", fanout.on_template_holders, methods=["POST"], name="admin"),
    Route("/warren/images/pull", fanout.on_every_node, methods=["POST"], name="admin"),
    Route("/warren/runtimes", fanout.on_every_node, methods=["POST"], name="admin"),
    Route("/warren/runtimes/reload", fanout.on_every_node, methods=["POST"], name="admin"),
    Route("/runtimes", fanout.list_runtimes, methods=["GET"], name="list"),
    Route("/openapi.json", fanout.openapi, methods=["GET"], name="other"),
    Route("/nodes", list_nodes, methods=["GET"], name="nodes"),
    Route("/nodes/{node_id}", get_node, methods=["GET"], name="nodes"),
    Route("/nodes/{node_id}", set_node_status, methods=["POST"], name="nodes"),
    Route("/{rest:path}", fanout.not_served, methods=["GET", "POST", "PUT", "PATCH", "DELETE"], name="other"),
]

"""E2B template builds through a gateway: each build runs on one node, and every call of it goes there.

The SDK's ``Template.build`` calls ``POST /v3/templates``, then per COPY step ``GET /templates/{id}/files/
{hash}`` and a PUT of the files to the URL that answer names, then ``POST /v2/templates/{id}/builds/{b}``
and ``GET .../builds/{b}/status`` until the build is done. The gateway:

* picks the build's node at ``POST /v3/templates``: the node that has the template already (a new build of
  it; its tags live there), else the least-loaded live node that is not draining. E2B's API names the base
  (``fromTemplate``) only at the start, after the uploads went to that node, so the base cannot steer the
  choice; a start whose base template is only on other nodes is a 409 that says so. A template several
  nodes hold (imported or ensured on each) is not rebuilt through the gateway (409): one node's copy would
  change and the others not;
* remembers template id and name -> node in Redis (:meth:`ClusterStore.set_template_node`), so the uploads,
  the start, the status polls and the tags of the build go to that node, and a create of the template a
  moment later, before a heartbeat lists it, is placed there (:class:`~warren.cluster.placement.PlacementRequest`);
* rewrites the upload URL a node answers with (pointing at itself) to point at the gateway, and relays the
  PUT to the node as it arrives, at most ``max_upload_bytes`` of it (else 413);
* answers calls on a template by id or name (status, aliases, tags, get, delete) from the node that has it:
  the remembered node first, then those whose heartbeat lists it, then (Redis emptied, heartbeat not in yet)
  every other live node, until one answers other than 404. Tag changes go to every node that holds it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...api.models import parse_json_object
from ...errors import ConflictError, InvalidRequestError, NotFoundError, PayloadTooLargeError, UnavailableError
from ..placement import PlacementRequest
from ..records import NodeView
from .fanout import ADMIN_TIMEOUT, fan_out
from .upstream import passed_headers, relay

if TYPE_CHECKING:
    from .routes import Gateway

_BUSY = (429, 503)
"""A node's answers to a build request that send it to the next node (it builds nothing, or is stopping)."""


def _gateway(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


def _name(ref: str) -> str:
    return ref.partition(":")[0]


async def _nodes_of(gw: Gateway, ref: str, *, anyone: bool) -> list[NodeView]:
    """Live nodes to ask about template ``ref`` (id or name; a ``:tag`` is ignored), best first: the node a
    build through a gateway made it on, those whose heartbeat lists it, then (``anyone``) every other."""
    name = _name(ref)
    live = [v for v in await gw.directory.nodes(fresh=True) if v.alive]
    if not live:
        raise UnavailableError("no live node in the cluster")
    built_on = await gw.directory.store.template_node(name)
    first = [v for v in live if v.node_id == built_on]
    holders = [v for v in live if v.info.template(name) is not None and v.node_id != built_on]
    picked = {v.node_id for v in first + holders}
    return first + holders + ([v for v in live if v.node_id not in picked] if anyone else [])


async def _first_knowing(gw: Gateway, request: Request, ref: str, body: bytes) -> tuple[NodeView, httpx.Response]:
    """``request`` to the template's nodes in turn until one answers other than 404 (or the last 404)."""
    unreachable: list[str] = []
    found: tuple[NodeView, httpx.Response] | None = None
    for view in await _nodes_of(gw, ref, anyone=True):
        try:
            answer = await gw.client.forward(view.info.url, request, body)
        except UnavailableError as exc:
            unreachable.append(f"{view.node_id}: {exc}")
            continue
        found = (view, answer)
        if answer.status_code != 404:
            return found
    if found is None:
        raise UnavailableError(f"no node that may have template {ref!r} answered: {'; '.join(unreachable)}")
    return found


async def request_build(request: Request) -> Response:
    """``POST /v3/templates`` (202): on the template's node, or on the least-loaded live one for a new name."""
    gw = _gateway(request)
    body = await request.body()
    doc = parse_json_object(body, allow_empty=False)
    ref = doc.get("name") or doc.get("alias")
    if not isinstance(ref, str) or not ref:
        raise InvalidRequestError("name is required")
    name = _name(ref)
    nodes = await gw.directory.nodes(fresh=True)
    holders = [v for v in nodes if v.info.template(name) is not None]
    if not holders:
        built_on = await gw.directory.store.template_node(name)
        holders = [v for v in nodes if v.node_id == built_on]
    elif any(v.alive for v in holders):
        holders = [v for v in holders if v.alive]  # a copy on a node that is down is that node's to rebuild
    if len(holders) > 1:
        raise ConflictError(
            f"template {name!r} is on nodes {', '.join(v.node_id for v in holders)}: a build through the gateway "
            "would change one node's copy only; build it on each node directly, or under another name"
        )
    if holders:
        [home] = holders
        if not home.alive or home.draining:
            raise UnavailableError(
                f"template {name!r} is on node {home.node_id}, which is {home.status}: its builds wait for it"
            )
        candidates = [home]
    else:
        live = [v for v in nodes if v.alive and not v.draining]
        if not live:
            raise UnavailableError("no live node in the cluster can build templates")
        candidates = gw.strategy.rank(PlacementRequest(name), live)
    refusals: list[str] = []
    for view in candidates:
        try:
            answer = await gw.client.forward(view.info.url, request, body)
        except UnavailableError as exc:
            refusals.append(f"{view.node_id}: {exc}")
            continue
        if answer.status_code == 202:
            made = answer.json()
            await gw.directory.store.set_template_node([str(made.get("templateID", "")), name], view.node_id)
            return relay(answer)
        if answer.status_code in _BUSY and len(candidates) > 1:
            refusals.append(f"{view.node_id}: {answer.status_code}")
            continue
        return relay(answer)
    raise UnavailableError(f"no node took the build of {name!r}: {'; '.join(refusals)}")


async def files_link(request: Request) -> Response:
    """``GET /templates/{id}/files/{hash}`` (201): the node's answer, its upload URL pointing at the gateway."""
    gw = _gateway(request)
    view, answer = await _first_knowing(gw, request, request.path_params["template_id"], b"")
    if answer.status_code != 201:
        return relay(answer)
    doc = answer.json()
    url = doc.get("url")
    node = urlsplit(view.info.url)
    if isinstance(url, str) and (here := urlsplit(url)).netloc == node.netloc:
        mine = urlsplit(str(request.base_url))
        doc["url"] = urlunsplit((mine.scheme, mine.netloc, here.path, here.query, ""))
    return JSONResponse(doc, status_code=201)


async def upload_files(request: Request) -> Response:
    """``PUT /warren/uploads/{id}/{hash}``: to the build's node, streamed, at most ``max_upload_bytes``."""
    gw = _gateway(request)
    template_id = request.path_params["template_id"]
    cap = gw.max_upload_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise PayloadTooLargeError(f"the upload is larger than the gateway's limit of {cap} bytes")
    views = await _nodes_of(gw, template_id, anyone=False)
    if not views:  # nothing remembered (Redis emptied) and no heartbeat lists it: ask who knows the build
        link = f"/templates/{template_id}/files/{request.path_params['filesHash']}"
        for view in await _nodes_of(gw, template_id, anyone=True):
            try:
                probe = await gw.client.call(view.info.url, "GET", link, headers=passed_headers(request))
            except UnavailableError:
                continue
            if probe.status_code == 201:
                views = [view]
                break
    if not views:
        raise NotFoundError(f"template {template_id} not found")
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        async for chunk in request.stream():
            sent += len(chunk)
            if sent > cap:
                raise PayloadTooLargeError(f"the upload is larger than the gateway's limit of {cap} bytes")
            yield chunk

    headers = [(k, v) for k, v in passed_headers(request) if k.lower() != "expect"]
    try:
        answer = await gw.client.open(views[0].info.url, "PUT", request.url.path, headers=headers, body=body(),
                                      timeouts=ADMIN_TIMEOUT)  # fmt: skip
    except UnavailableError:
        if sent > cap:
            raise PayloadTooLargeError(f"the upload is larger than the gateway's limit of {cap} bytes") from None
        raise
    try:
        await answer.aread()
    finally:
        await answer.aclose()
    return relay(answer)


async def start_build(request: Request) -> Response:
    """``POST /v2/templates/{id}/builds/{buildID}`` (202) on the build's node; 409 if its base is elsewhere."""
    gw = _gateway(request)
    template_id = request.path_params["template_id"]
    body = await request.body()
    base = parse_json_object(body, allow_empty=False).get("fromTemplate")
    views = await _nodes_of(gw, template_id, anyone=False)
    if isinstance(base, str) and base and views:
        home, base_name = views[0], _name(base)
        base_on = await gw.directory.store.template_node(base_name)
        elsewhere = sorted(
            {v.node_id for v in await gw.directory.nodes() if v.alive and v.info.template(base_name) is not None}
            | ({base_on} if base_on else set())
        )
        if elsewhere and home.node_id not in elsewhere and home.info.template(base_name) is None:
            raise ConflictError(
                f"the build of template {template_id} runs on node {home.node_id} (chosen when the build was "
                f"requested; E2B's API names the base only now), but its base template {base_name!r} is only on "
                f"{', '.join(elsewhere)}: build it on one of those nodes directly, or make the base on every node"
            )
    return relay((await _first_knowing(gw, request, template_id, body))[1])


async def on_template(request: Request) -> Response:
    """A call on one template by id or name (build status, alias, tags, get): its node's answer."""
    gw = _gateway(request)
    params = request.path_params
    ref = params["template_id"] if "template_id" in params else params["alias"]
    return relay((await _first_knowing(gw, request, ref, await request.body()))[1])


async def change_tags(request: Request) -> Response:
    """``POST``/``DELETE /templates/tags``: on every node that holds the template (tags go with its builds)."""
    gw = _gateway(request)
    body = await request.body()
    doc = parse_json_object(body, allow_empty=False)
    ref = doc.get("target" if request.method == "POST" else "name")
    if not isinstance(ref, str) or not ref:
        raise InvalidRequestError(f"{'target' if request.method == 'POST' else 'name'} is required")
    holders = await _nodes_of(gw, ref, anyone=False)
    if not holders:
        return relay((await _first_knowing(gw, request, ref, body))[1])
    return await fan_out(gw, request, body, holders)


async def template_by_ref(request: Request) -> Response:
    """``GET``/``DELETE /templates/{ref}`` (a template, or a snapshot by id: the SDK deletes snapshots here):
    to the live nodes that hold it (a delete: to each); a template deleted is forgotten in Redis."""
    gw = _gateway(request)
    ref = request.path_params["ref"]
    built_on = await gw.directory.store.template_node(ref)
    holders = [
        v for v in await gw.directory.nodes(fresh=True)
        if v.alive and (v.info.snapshot(ref) is not None or v.info.template(ref) is not None or v.node_id == built_on)
    ]  # fmt: skip
    if not holders:
        raise NotFoundError(f"template or snapshot {ref} not found")
    body = await request.body()
    answers = [
        (v, await gw.client.forward(v.info.url, request, body))
        for v in holders[: 1 if request.method == "GET" else None]
    ]
    if request.method == "DELETE":
        for view, answer in answers:
            if answer.status_code == 204:
                await gw.directory.store.forget_template([ref], view.node_id)
    return relay(next((a for _, a in answers if a.status_code < 300), answers[-1][1]))

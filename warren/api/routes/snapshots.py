"""E2B snapshot routes: create from a sandbox, list with filters and pages, get, delete."""

from __future__ import annotations

import base64

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...errors import InvalidRequestError, NotFoundError
from ...ints import parse_optional_int
from ...names import validate_name
from ..models import parse_json_object, snapshot_body
from ..services import services


async def create_snapshot(request: Request) -> Response:
    body = parse_json_object(await request.body())
    name = body.get("name")
    if name is not None:
        validate_name(name, "snapshot")
    manifest = await services(request).manager.snapshot(request.path_params["sandbox_id"], name)
    return JSONResponse({"snapshotID": manifest.snapshot_id, "names": list(manifest.names)}, status_code=201)


async def list_snapshots(request: Request) -> Response:
    repo = services(request).snapshots
    if repo is None:
        return JSONResponse([])
    q = request.query_params
    items = [m for m in repo.list() if not any(n.startswith("template:") for n in m.names)]
    if sandbox_id := q.get("sandboxID"):
        items = [m for m in items if m.source_sandbox_id == sandbox_id]
    if name := q.get("name"):
        items = [m for m in items if name in m.names or m.snapshot_id == name]
    if token := q.get("nextToken"):
        try:
            after = base64.urlsafe_b64decode(token.encode()).decode()
        except ValueError:
            raise InvalidRequestError("invalid nextToken") from None
        items = [m for m in items if f"{m.created_at!r}:{m.snapshot_id}" > after]
    headers = None
    limit = parse_optional_int(q.get("limit"), "limit", minimum=1, maximum=1000, error=InvalidRequestError)
    if limit is not None and len(items) > limit:
        items = items[:limit]
        last = f"{items[-1].created_at!r}:{items[-1].snapshot_id}"
        headers = {"x-next-token": base64.urlsafe_b64encode(last.encode()).decode()}
    return JSONResponse([snapshot_body(m) for m in items], headers=headers)


async def get_snapshot(request: Request) -> Response:
    repo = services(request).snapshots
    manifest = repo.find(request.path_params["snapshot_id"]) if repo else None
    if manifest is None:
        raise NotFoundError(f"snapshot {request.path_params['snapshot_id']} not found")
    return JSONResponse(snapshot_body(manifest))


async def delete_snapshot(request: Request) -> Response:
    repo = services(request).snapshots
    manifest = repo.find(request.path_params["snapshot_id"]) if repo else None
    if manifest is None or repo is None:
        raise NotFoundError(f"snapshot {request.path_params['snapshot_id']} not found")
    await services(request).manager.delete_snapshot(manifest.snapshot_id)
    return Response(status_code=204)


ROUTES = [
    Route("/sandboxes/{sandbox_id}/snapshots", create_snapshot, methods=["POST"]),
    Route("/snapshots", list_snapshots, methods=["GET"]),
    Route("/snapshots/{snapshot_id}", get_snapshot, methods=["GET"]),
    Route("/snapshots/{snapshot_id}", delete_snapshot, methods=["DELETE"]),
]

"""Moves of paused sandboxes between nodes, for the cluster's gateways (:mod:`warren.orchestrator.moves`).

* ``POST /warren/sandboxes/{id}/adopt``: take over a sandbox another node parked in the shared store;
  201 with the sandbox (paused here; the next resume or connect restores it). 404 when the store has no
  copy of it, 409 when this node cannot run it (its template or runtime hash is missing: the message
  names it) or has no shared store.
* ``POST /warren/sandboxes/{id}/release``: this node's paused copy of a sandbox that moved elsewhere
  goes; the shared store's copy stays. 204; 404 when it is not here, 409 when it is not paused here.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..models import sandbox_body
from ..services import services


async def adopt(request: Request) -> Response:
    svc = services(request)
    record = await svc.manager.adopt(request.path_params["sandbox_id"])
    return JSONResponse(sandbox_body(record, svc.settings.domain), status_code=201)


async def release(request: Request) -> Response:
    await services(request).manager.release(request.path_params["sandbox_id"])
    return Response(status_code=204)


ROUTES = [
    Route("/warren/sandboxes/{sandbox_id}/adopt", adopt, methods=["POST"]),
    Route("/warren/sandboxes/{sandbox_id}/release", release, methods=["POST"]),
]

"""Runtime advertising (seed 003): the node's runtimes by hash, and the node description."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...errors import NotFoundError, UnavailableError
from ...runtime.records import RuntimeRecord, check_usable
from ..models import parse_json_object
from ..services import Services, services


def _runtimes(svc: Services) -> list[dict[str, object]]:
    return svc.registry.describe() if svc.registry else []


async def list_runtimes(request: Request) -> Response:
    return JSONResponse(_runtimes(services(request)))


async def register_runtime(request: Request) -> Response:
    """Register a runtime record (e.g. one a snapshot from another node needs); not made default."""
    svc = services(request)
    if svc.registry is None:
        raise UnavailableError("this node has no runtime index")
    record = check_usable(RuntimeRecord.from_dict(parse_json_object(await request.body(), allow_empty=False)))
    runtime_hash = await svc.registry.index.register(record)
    return JSONResponse({"hash": runtime_hash, "class": record.sandbox_class}, status_code=201)


async def reload_runtimes(request: Request) -> Response:
    svc = services(request)
    if svc.reload_runtimes is None:
        raise UnavailableError("this node cannot reload its runtimes")
    await svc.reload_runtimes()
    return JSONResponse(_runtimes(svc))


def _node(svc: Services) -> dict[str, object]:
    runtimes = _runtimes(svc)
    return {
        "nodeID": svc.settings.node_name,
        "status": "ready",
        "sandboxCount": svc.manager.count(),
        "runtimeHashes": [r["hash"] for r in runtimes],
        "defaultRuntimes": {str(r["class"]): r["hash"] for r in runtimes if r["default"]},
        "runtimes": runtimes,
    }


async def list_nodes(request: Request) -> Response:
    return JSONResponse([_node(services(request))])


async def get_node(request: Request) -> Response:
    svc = services(request)
    if request.path_params["node_id"] != svc.settings.node_name:
        raise NotFoundError(f"node {request.path_params['node_id']} not found")
    return JSONResponse(_node(svc))


ROUTES = [
    Route("/runtimes", list_runtimes, methods=["GET"]),
    Route("/warren/runtimes", register_runtime, methods=["POST"]),
    Route("/warren/runtimes/reload", reload_runtimes, methods=["POST"]),
    Route("/nodes", list_nodes, methods=["GET"]),
    Route("/nodes/{node_id}", get_node, methods=["GET"]),
]

"""E2B sandbox routes: parse, call the orchestrator, serialize."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ... import phases
from ...errors import InvalidRequestError, WarrenError
from ...ints import parse_optional_int
from ..errors import status_for
from ..models import (
    detail_body,
    listed_body,
    metric_body,
    optional_int,
    parse_create,
    parse_json_object,
    parse_list_query,
    parse_network,
    sandbox_body,
)
from ..network import parse_update
from ..services import services

BUILTIN_WAIT_S = 45.0
"""How long a create naming a built-in template that is not built yet waits for its build: under the SDK's
request timeout (60 s), so a longer build answers 503 saying so while it goes on."""


async def create(request: Request) -> Response:
    svc = services(request)
    with phases.operation("create"):
        req = parse_create(parse_json_object(await request.body(), allow_empty=False))
        if svc.code_interpreter is not None and svc.code_interpreter.handles(req.template):
            await svc.code_interpreter.ready(req.template, BUILTIN_WAIT_S)  # first use builds it
        record = await svc.manager.create(req)
        return JSONResponse(sandbox_body(record, svc.settings.domain), status_code=201)


async def list_sandboxes(request: Request) -> Response:
    """``GET /v2/sandboxes``: newest first unless ``order=asc``; state, metadata, startedAfter, template."""
    return _listed(request, dict(request.query_params))


async def list_running(request: Request) -> Response:
    """``GET /sandboxes`` (v1): E2B lists running sandboxes only; the other filters as in v2."""
    params = dict(request.query_params)
    params.setdefault("state", "running")
    return _listed(request, params)


def _listed(request: Request, params: dict[str, str]) -> Response:
    svc = services(request)
    page, next_token = svc.manager.list(parse_list_query(params))
    headers = {"x-total-running": str(len(svc.manager.running_ids()))}
    if next_token:
        headers["x-next-token"] = next_token
    return JSONResponse([listed_body(r) for r in page], headers=headers)


async def get_sandbox(request: Request) -> Response:
    svc = services(request)
    record = svc.manager.get(request.path_params["sandbox_id"])
    return JSONResponse(detail_body(record, svc.settings.domain))


async def kill(request: Request) -> Response:
    await services(request).manager.kill(request.path_params["sandbox_id"])
    return Response(status_code=204)


async def set_timeout(request: Request) -> Response:
    body = parse_json_object(await request.body(), allow_empty=False)
    timeout = optional_int(body, "timeout")
    if timeout is None:
        raise InvalidRequestError("timeout is required")
    await services(request).manager.set_timeout(request.path_params["sandbox_id"], timeout)
    return Response(status_code=204)


async def connect(request: Request) -> Response:
    svc = services(request)
    with phases.operation("connect"):
        body = parse_json_object(await request.body())
        record, resumed = await svc.manager.connect(request.path_params["sandbox_id"], optional_int(body, "timeout"))
    return JSONResponse(sandbox_body(record, svc.settings.domain), status_code=201 if resumed else 200)


async def update_network(request: Request) -> Response:
    """E2B's ``PUT /sandboxes/{id}/network``: the whole egress policy is replaced; 204."""
    body = parse_json_object(await request.body())
    egress = parse_update(body)
    asked = parse_network({k: body[k] for k in ("allowOut", "denyOut") if k in body})
    await services(request).manager.update_network(request.path_params["sandbox_id"], egress, asked)
    return Response(status_code=204)


async def metrics(request: Request) -> Response:
    """The sandbox's 5 s samples, oldest first, within ``start``/``end`` (Unix seconds)."""
    params = request.query_params
    start = parse_optional_int(params.get("start"), "start", minimum=0, error=InvalidRequestError)
    end = parse_optional_int(params.get("end"), "end", minimum=0, error=InvalidRequestError)
    if start is not None and end is not None and start > end:
        raise InvalidRequestError("start must not be after end")
    series = await services(request).manager.metrics(request.path_params["sandbox_id"], start, end)
    return JSONResponse([metric_body(m) for m in series])


_BATCH_METRICS_MAX = 100


async def batch_metrics(request: Request) -> Response:
    """``GET /sandboxes/metrics?sandbox_ids=a,b``: each known sandbox's newest sample (``SandboxesWithMetrics``)."""
    raw = ",".join(request.query_params.getlist("sandbox_ids"))
    ids = list(dict.fromkeys(i.strip() for i in raw.split(",") if i.strip()))
    if not ids:
        raise InvalidRequestError("sandbox_ids is required: a comma-separated list of sandbox ids")
    if len(ids) > _BATCH_METRICS_MAX:
        raise InvalidRequestError(f"sandbox_ids takes at most {_BATCH_METRICS_MAX} ids")
    latest = await services(request).manager.latest_metrics(ids)
    return JSONResponse({"sandboxes": {i: metric_body(m) for i, m in latest.items()}})


def _bool(body: dict[str, object], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{key} must be a boolean")
    return value


async def pause(request: Request) -> Response:
    with phases.operation("pause"):
        body = parse_json_object(await request.body())
        await services(request).manager.pause(request.path_params["sandbox_id"], memory=_bool(body, "memory", True))
        return Response(status_code=204)


async def resume(request: Request) -> Response:
    """Deprecated in E2B (``connect`` resumes); kept working."""
    svc = services(request)
    with phases.operation("resume"):
        body = parse_json_object(await request.body())
        record = await svc.manager.resume(request.path_params["sandbox_id"], optional_int(body, "timeout"))
    return JSONResponse(sandbox_body(record, svc.settings.domain), status_code=201)


async def fork(request: Request) -> Response:
    svc = services(request)
    body = parse_json_object(await request.body())
    count = optional_int(body, "count")
    results = await svc.manager.fork(
        request.path_params["sandbox_id"], 1 if count is None else count, optional_int(body, "timeout")
    )
    out: list[dict[str, object]] = []
    for item in results:
        if isinstance(item, WarrenError):
            status = status_for(item)
            out.append({"error": {"code": status, "message": str(item)}})
        else:
            out.append({"sandbox": sandbox_body(item, svc.settings.domain)})
    return JSONResponse(out, status_code=201)


ROUTES = [
    Route("/sandboxes/metrics", batch_metrics, methods=["GET"]),  # before /sandboxes/{sandbox_id}
    Route("/sandboxes/{sandbox_id}/pause", pause, methods=["POST"]),
    Route("/sandboxes/{sandbox_id}/resume", resume, methods=["POST"]),
    Route("/sandboxes/{sandbox_id}/fork", fork, methods=["POST"]),
    Route("/sandboxes", create, methods=["POST"]),
    Route("/v2/sandboxes", create, methods=["POST"]),
    Route("/sandboxes", list_running, methods=["GET"]),
    Route("/v2/sandboxes", list_sandboxes, methods=["GET"]),
    Route("/sandboxes/{sandbox_id}", get_sandbox, methods=["GET"]),
    Route("/sandboxes/{sandbox_id}", kill, methods=["DELETE"]),
    Route("/sandboxes/{sandbox_id}/timeout", set_timeout, methods=["POST"]),
    Route("/sandboxes/{sandbox_id}/connect", connect, methods=["POST"]),
    Route("/v2/sandboxes/{sandbox_id}/connect", connect, methods=["POST"]),
    Route("/sandboxes/{sandbox_id}/metrics", metrics, methods=["GET"]),
    Route("/sandboxes/{sandbox_id}/network", update_network, methods=["PUT"]),
]

"""E2B sandbox routes: parse, call the orchestrator, serialize."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ... import phases
from ...errors import InvalidRequestError, WarrenError
from ..errors import status_for
from ..models import (
    detail_body,
    listed_body,
    optional_int,
    parse_create,
    parse_json_object,
    parse_list_query,
    rfc3339,
    sandbox_body,
)
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
    svc = services(request)
    query = parse_list_query(dict(request.query_params))
    page, next_token = svc.manager.list(query)
    headers = {"x-next-token": next_token} if next_token else None
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


async def metrics(request: Request) -> Response:
    stats, cpu_pct = await services(request).manager.metrics(request.path_params["sandbox_id"])
    now = time.time()
    return JSONResponse(
        [
            {
                "timestamp": rfc3339(now),
                "timestampUnix": int(now),
                "cpuCount": stats.cpu_count,
                "cpuUsedPct": round(cpu_pct, 2),
                "memUsed": stats.memory_used,
                "memTotal": stats.memory_total,
                "memCache": stats.memory_cache,
                "diskUsed": stats.disk_used,
                "diskTotal": stats.disk_total,
            }
        ]
    )


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
    Route("/sandboxes/{sandbox_id}/pause", pause, methods=["POST"]),
    Route("/sandboxes/{sandbox_id}/resume", resume, methods=["POST"]),
    Route("/sandboxes/{sandbox_id}/fork", fork, methods=["POST"]),
    Route("/sandboxes", create, methods=["POST"]),
    Route("/v2/sandboxes", create, methods=["POST"]),
    Route("/sandboxes", list_sandboxes, methods=["GET"]),
    Route("/v2/sandboxes", list_sandboxes, methods=["GET"]),
    Route("/sandboxes/{sandbox_id}", get_sandbox, methods=["GET"]),
    Route("/sandboxes/{sandbox_id}", kill, methods=["DELETE"]),
    Route("/sandboxes/{sandbox_id}/timeout", set_timeout, methods=["POST"]),
    Route("/sandboxes/{sandbox_id}/connect", connect, methods=["POST"]),
    Route("/v2/sandboxes/{sandbox_id}/connect", connect, methods=["POST"]),
    Route("/sandboxes/{sandbox_id}/metrics", metrics, methods=["GET"]),
]

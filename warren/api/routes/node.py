"""Node routes: health with runtime probe details, Prometheus metrics, the OpenAPI document, rootfs imports
(template listing, builds and deletion are in ``templates.py``)."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...errors import InvalidRequestError, NotFoundError
from ..auth import key_matches
from ..errors import error_response
from ..metrics import exposition, metrics_allowed
from ..models import parse_json_object, template_body
from ..openapi import OPENAPI
from ..services import services


async def health(request: Request) -> Response:
    """``{"status"}`` for anyone (load balancers, probes); the details (paths, runtime probes, pools,
    limits) only with a valid ``X-API-Key``."""
    svc = services(request)
    if not key_matches(svc.api_key, request.headers.get("x-api-key")):
        return JSONResponse({"status": "ok"})
    return JSONResponse(
        {
            "status": "ok",
            **svc.info,
            "sandboxes": svc.manager.count(),
            "runtimes": dict(svc.probes()),
            "warmPool": svc.manager.pool.stats(),
            "limits": {
                "sandboxes": svc.manager.limits(),
                **(svc.builds.limits() if svc.builds is not None else {}),
            },
        }
    )


async def metrics(request: Request) -> Response:
    """Prometheus's text format (``warren.api.metrics``); the key only with ``WARREN_METRICS_PUBLIC=0``."""
    svc = services(request)
    if not metrics_allowed(request.headers, svc.api_key, svc.settings.metrics_public):
        return error_response(401, "the metrics need the API key (WARREN_METRICS_PUBLIC=0): send X-API-Key or "
                                   "Authorization: Bearer")  # fmt: skip
    if svc.metrics is None:
        raise NotFoundError("this node keeps no metrics")
    return exposition(svc.metrics.registry)


async def openapi(request: Request) -> Response:
    return JSONResponse(OPENAPI)


async def import_template(request: Request) -> Response:
    body = parse_json_object(await request.body(), allow_empty=False)
    path, name, runtime = body.get("path"), body.get("name"), body.get("runtime")
    if not isinstance(path, str) or not isinstance(name, str) or not name:
        raise InvalidRequestError("path and name are required strings")
    if runtime is not None and not isinstance(runtime, str):
        raise InvalidRequestError("runtime must be a string")
    record = await services(request).import_template(Path(path), name, runtime)
    return JSONResponse(template_body(record), status_code=201)


async def set_pool_size(request: Request) -> Response:
    """Per-template warm-pool size (0 disables); the template joins the pool at once."""
    svc = services(request)
    body = parse_json_object(await request.body(), allow_empty=False)
    size = body.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= 64:
        raise InvalidRequestError("size must be an integer from 0 to 64")
    template = await svc.templates.find(request.path_params["template_id"])
    if template is None:
        raise NotFoundError(f"template '{request.path_params['template_id']}' not found")
    svc.manager.pool.set_size(template.id, size)
    svc.manager.pool.want(template)
    return JSONResponse({"templateID": template.id, "size": size})


ROUTES = [
    Route("/warren/templates/{template_id}/pool", set_pool_size, methods=["POST"]),
    Route("/health", health, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/openapi.json", openapi, methods=["GET"]),
    Route("/warren/templates/import", import_template, methods=["POST"]),
]

PUBLIC_PATHS = frozenset({"/health", "/metrics", "/openapi.json"})
"""Paths the API-key middleware lets through (``/health`` and ``/metrics`` check the key themselves)."""

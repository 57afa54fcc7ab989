"""Node routes: health with runtime probe details, the OpenAPI document, rootfs imports (template
listing, builds and deletion are in ``templates.py``)."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...errors import InvalidRequestError
from ..models import parse_json_object, template_body
from ..openapi import OPENAPI
from ..services import services


async def health(request: Request) -> Response:
    svc = services(request)
    return JSONResponse(
        {
            "status": "ok",
            **svc.info,
            "sandboxes": svc.manager.count(),
            "runtimes": dict(svc.probes()),
        }
    )


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


ROUTES = [
    Route("/health", health, methods=["GET"]),
    Route("/openapi.json", openapi, methods=["GET"]),
    Route("/warren/templates/import", import_template, methods=["POST"]),
]

PUBLIC_PATHS = frozenset({"/health", "/openapi.json"})

"""E2B template routes: build requests, context uploads, builds and their status, list/get/delete, aliases.

The SDK's ``Template.build`` calls, in order: ``POST /v3/templates`` (202), for each COPY step
``GET /templates/{id}/files/{hash}`` (201; when ``present`` is false it PUTs a tar of the files to
the ``url`` we return, which points back at this node), ``POST /v2/templates/{id}/builds/{buildID}``
(202), then ``GET /templates/{id}/builds/{buildID}/status`` until the build is ready or failed and
no log entries are left. The engine is ``warren.templates.build.BuildService``.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...errors import InvalidRequestError, NotFoundError, PayloadTooLargeError, UnavailableError
from ...ints import parse_optional_int
from ...store import TemplateRecord, build_id_of, provenance_json
from ...templates.build import Build, BuildService
from ...templates.buildlog import rfc3339
from ...templates.steps import parse_build_request
from ...templates.uploads import upload_too_large
from ..models import ENVD_VERSION, optional_int, parse_json_object, template_body
from ..services import services

UPLOAD_PATH = "/warren/uploads/{template_id}/{filesHash}"


def _builds(request: Request) -> BuildService:
    builds = services(request).builds
    if builds is None:
        raise UnavailableError("this node does not build templates")
    return builds


def _build_body(b: Build) -> dict[str, Any]:
    return {
        "buildID": b.build_id,
        "status": b.log.status.value,
        "createdAt": rfc3339(b.created_at),
        "updatedAt": rfc3339(b.finished_at or b.created_at),
        "finishedAt": rfc3339(b.finished_at) if b.finished_at else None,
        "cpuCount": b.cpu_count,
        "memoryMB": b.memory_mb,
        "envdVersion": ENVD_VERSION,
    }


def detail_body(rec: TemplateRecord, builds: list[Build]) -> dict[str, Any]:
    """``TemplateWithBuilds``: the current build plus any this node still remembers."""
    current = {
        "buildID": build_id_of(rec),
        "status": "ready",
        "createdAt": rfc3339(rec.build.built_at or rec.created_at),
        "updatedAt": rfc3339(rec.build.built_at or rec.created_at),
        "cpuCount": rec.cpu_count,
        "memoryMB": rec.memory_mb,
        "diskSizeMB": rec.disk_mb,
        "envdVersion": ENVD_VERSION,
    }
    others = [_build_body(b) for b in builds if b.build_id != current["buildID"]]
    return {**template_body(rec), "builds": [current, *others], "build": provenance_json(rec.build)}


async def request_build(request: Request) -> Response:
    """``POST /v3/templates`` (202): ``name`` (or the older ``alias``), ``cpuCount``, ``memoryMB``, ``tags``.

    warren extension: ``runtime`` (``runc``/``gvisor``) for the template's sandboxes.
    """
    body = parse_json_object(await request.body(), allow_empty=False)
    name = body.get("name") or body.get("alias")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("name is required")
    tags = body.get("tags") or []
    if not isinstance(tags, list):
        raise InvalidRequestError("tags must be a list of strings")
    runtime = body.get("runtime")
    if runtime is not None and not isinstance(runtime, str):
        raise InvalidRequestError("runtime must be a string")
    build = await _builds(request).request(
        name,
        cpu_count=optional_int(body, "cpuCount"),
        memory_mb=optional_int(body, "memoryMB"),
        tags=tags,
        runtime=runtime,
    )
    return JSONResponse(
        {
            "templateID": build.template_id,
            "buildID": build.build_id,
            "public": False,
            "names": [build.name],
            "tags": list(build.tags),
            "aliases": [build.name],
        },
        status_code=202,
    )


async def files_link(request: Request) -> Response:
    """``GET /templates/{id}/files/{hash}`` (201): ``{present, url, headers}``; the SDK PUTs the tar to ``url``."""
    template_id, files_hash = request.path_params["template_id"], request.path_params["filesHash"]
    present = await _builds(request).files_present(template_id, files_hash)
    url = str(request.base_url).rstrip("/") + UPLOAD_PATH.format(template_id=template_id, filesHash=files_hash)
    body: dict[str, Any] = {"present": present, "url": url}
    # The SDK uploads with a plain HTTP client that has no API key of its own: hand back the caller's.
    if key := request.headers.get("x-api-key"):
        body["headers"] = {"X-API-Key": key}
    return JSONResponse(body, status_code=201)


async def upload_files(request: Request) -> Response:
    """``PUT /warren/uploads/{id}/{hash}`` (201): the tar of one COPY step, stored under its files hash.

    Over ``max_upload_bytes`` (counted as the body arrives; a larger Content-Length is refused at once): 413.
    """
    cap = services(request).settings.max_upload_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise PayloadTooLargeError(upload_too_large(cap))
    size = await _builds(request).receive_upload(
        request.path_params["template_id"], request.path_params["filesHash"], request.stream()
    )
    return JSONResponse({"filesHash": request.path_params["filesHash"], "size": size}, status_code=201)


async def start_build(request: Request) -> Response:
    """``POST /v2/templates/{id}/builds/{buildID}`` (202): ``fromImage``/``fromTemplate``, ``steps``, ``force``,
    ``startCmd``, ``readyCmd``. The build runs in the background; its errors appear in its status."""
    body = parse_json_object(await request.body(), allow_empty=False)
    req = parse_build_request(body)
    _builds(request).start(request.path_params["template_id"], request.path_params["buildID"], req)
    return Response(status_code=202)


async def build_status(request: Request) -> Response:
    """``GET /templates/{id}/builds/{buildID}/status?logsOffset=N&limit=L``: status and log entries from N."""
    params = request.query_params
    offset = parse_optional_int(params.get("logsOffset"), "logsOffset", minimum=0, error=InvalidRequestError)
    limit = parse_optional_int(params.get("limit"), "limit", minimum=0, error=InvalidRequestError)
    template_id, build_id = request.path_params["template_id"], request.path_params["buildID"]
    buildlog = await _builds(request).status(template_id, build_id)
    return JSONResponse(buildlog.body(template_id, build_id, offset or 0, limit))


async def list_templates(request: Request) -> Response:
    return JSONResponse([template_body(t) for t in await services(request).templates.all()])


async def get_template(request: Request) -> Response:
    svc = services(request)
    template = await svc.templates.find(request.path_params["template_id"])
    if template is None:
        raise NotFoundError(f"template '{request.path_params['template_id']}' not found")
    builds = svc.builds.builds_of(template.id) if svc.builds is not None else []
    return JSONResponse(detail_body(template, builds))


async def delete_template(request: Request) -> Response:
    """``DELETE /templates/{id}`` (204): remove a template and the layers only it used.

    **Refused with 409 while a sandbox uses the template** (running or paused, created from it) or
    a build runs on it; kill those sandboxes first. Layers that sandboxes, snapshots or other
    templates still use are kept. The SDK's ``Sandbox.delete_snapshot`` calls this route with a
    snapshot id: a name that is no template but a snapshot deletes the snapshot. 404 otherwise.
    """
    svc = services(request)
    target = request.path_params["template_id"]
    if await svc.templates.find(target) is None and svc.snapshots is not None:
        manifest = svc.snapshots.find(target)
        if manifest is not None:
            await svc.manager.delete_snapshot(manifest.snapshot_id)
            return Response(status_code=204)
    await _builds(request).delete(target)
    return Response(status_code=204)


async def alias(request: Request) -> Response:
    """``GET /templates/aliases/{alias}``: 200 ``{templateID, public}`` when a template has that name, else 404."""
    template = await services(request).templates.find(request.path_params["alias"])
    if template is None or template.name != request.path_params["alias"]:
        raise NotFoundError(f"no template named '{request.path_params['alias']}'")
    return JSONResponse({"templateID": template.id, "public": False})


def _string(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{key} is required")
    return value


async def assign_tags(request: Request) -> Response:
    """``POST /templates/tags`` (201): ``{target: "name[:tag]", tags}`` points the tags at the build
    ``target`` names; answers ``{tags, buildID}``. Bad tags 400; unknown template or tag 404."""
    body = parse_json_object(await request.body(), allow_empty=False)
    build_id, tags = await _builds(request).tags.assign(_string(body, "target"), body.get("tags"))
    return JSONResponse({"tags": tags, "buildID": build_id}, status_code=201)


async def delete_tags(request: Request) -> Response:
    """``DELETE /templates/tags`` (204): ``{name, tags}``; ``default`` cannot be removed (400)."""
    body = parse_json_object(await request.body(), allow_empty=False)
    await _builds(request).tags.remove(_string(body, "name"), body.get("tags"))
    return Response(status_code=204)


async def list_tags(request: Request) -> Response:
    """``GET /templates/{id}/tags``: ``[{tag, buildID, createdAt}]`` of a template by id or name."""
    tags = await _builds(request).tags.of(request.path_params["template_id"])
    return JSONResponse([{"tag": t.tag, "buildID": t.build_id, "createdAt": rfc3339(t.created_at)} for t in tags])


ROUTES = [
    Route("/templates/tags", assign_tags, methods=["POST"]),
    Route("/templates/tags", delete_tags, methods=["DELETE"]),
    Route("/templates/{template_id}/tags", list_tags, methods=["GET"]),
    Route("/v3/templates", request_build, methods=["POST"]),
    Route("/templates/aliases/{alias}", alias, methods=["GET"]),
    Route("/templates/{template_id}/files/{filesHash}", files_link, methods=["GET"]),
    Route(UPLOAD_PATH, upload_files, methods=["PUT"]),
    Route("/v2/templates/{template_id}/builds/{buildID}", start_build, methods=["POST"]),
    Route("/templates/{template_id}/builds/{buildID}/status", build_status, methods=["GET"]),
    Route("/templates", list_templates, methods=["GET"]),
    Route("/v2/templates", list_templates, methods=["GET"]),
    Route("/templates/{template_id}", get_template, methods=["GET"]),
    Route("/templates/{template_id}", delete_template, methods=["DELETE"]),
]

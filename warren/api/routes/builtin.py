"""``POST /warren/templates/ensure``: make a built-in template exist (``code-interpreter-v1``), streaming progress.

Request ``{"name": "code-interpreter-v1"}`` (or ``code-interpreter-v1-gvisor``). The answer is 200
``application/x-ndjson``, one JSON object per line::

    {"event": "log", "message": "…"}                      (the build's log, or the cache import)
    {"event": "template", "template": {…the template…}}   (last line on success)
    {"event": "error", "message": "…"}                    (last line on failure)

The work is the node's (:class:`warren.templates.codeinterp.Provisioner`): a client that disconnects
leaves it running, and a create naming the template meanwhile waits on the same job. ``warren setup
--with code-interpreter`` and the end-to-end tests call it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ...errors import InvalidRequestError, NotFoundError, UnavailableError, WarrenError
from ..models import parse_json_object, template_body
from ..services import services


def _line(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


async def ensure_template(request: Request) -> Response:
    svc = services(request)
    provisioner = svc.code_interpreter
    if provisioner is None:
        raise UnavailableError("this node does not build built-in templates")
    body = parse_json_object(await request.body(), allow_empty=False)
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("name is required")
    if not provisioner.handles(name):
        raise NotFoundError(f"no built-in template named {name!r} to build")

    async def stream() -> AsyncIterator[bytes]:
        try:
            async for line in provisioner.follow(name):
                yield _line({"event": "log", "message": line})
        except WarrenError as exc:
            yield _line({"event": "error", "message": str(exc)})
            return
        record = await svc.templates.find(name)
        if record is None:
            yield _line({"event": "error", "message": f"template {name} is not in the store"})
        else:
            yield _line({"event": "template", "template": template_body(record)})

    return StreamingResponse(stream(), media_type="application/x-ndjson")


ROUTES = [Route("/warren/templates/ensure", ensure_template, methods=["POST"])]

"""``POST /warren/images/pull``: pull an OCI image into a new template, streaming progress as NDJSON.

Request ``{"image": "busybox:latest", "name": "busybox", "runtime"?: "runc"}``. The answer is 200
``application/x-ndjson``, one JSON object per line::

    {"event": "resolved", "digest": "sha256:…"}
    {"event": "download", "digest": "sha256:…", "current": 0, "total": 2134}      (also progress, downloaded)
    {"event": "exists" | "unpack" | "unpacked", "digest": "sha256:<diffID>"}
    {"event": "log", "message": "…"}
    {"event": "template", "template": {…the template…}}                           (last line on success)
    {"event": "error", "message": "…"}                                            (last line on failure)

A request that is wrong before anything is pulled (bad JSON, taken name) gets a plain JSON error
status instead. A client that disconnects cancels the pull, which then removes what it created.
Registry failures (including the registry refusing credentials) are ``error`` events, never an
HTTP 401 of this API.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ...errors import ConflictError, InvalidRequestError, UnavailableError, WarrenError
from ...images import ProgressEvent
from ...store import TemplateRecord
from ...templates.build import validate_name
from ..models import parse_json_object, template_body
from ..services import services


def _line(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


async def pull_image(request: Request) -> Response:
    svc = services(request)
    builds = svc.builds
    if builds is None:
        raise UnavailableError("this node does not pull images")
    body = parse_json_object(await request.body(), allow_empty=False)
    image, name, runtime = body.get("image"), body.get("name"), body.get("runtime")
    if not isinstance(image, str) or not image:
        raise InvalidRequestError("image is required")
    if name is None:
        name = image.rsplit("/", 1)[-1].split("@", 1)[0].replace(":", "-")
    if not isinstance(name, str):
        raise InvalidRequestError("name must be a string")
    validate_name(name)
    if runtime is not None and not isinstance(runtime, str):
        raise InvalidRequestError("runtime must be a string")
    if await svc.templates.find(name) is not None:
        raise ConflictError(f"template '{name}' exists already; delete it first or choose another name")

    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def on_event(event: ProgressEvent) -> None:
        doc: dict[str, Any] = {"event": event.kind, "digest": event.digest}
        if event.total:
            doc.update(current=event.current, total=event.total)
        if event.message:
            doc["message"] = event.message
        queue.put_nowait(doc)

    async def work() -> TemplateRecord:
        def say(message: str) -> None:
            queue.put_nowait({"event": "log", "message": message})

        return await builds.pull_template(image, name, runtime=runtime, progress=on_event, say=say)

    async def stream() -> AsyncIterator[bytes]:
        task = asyncio.create_task(work(), name=f"pull {image}")
        try:
            while not task.done() or not queue.empty():
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield _line(getter.result())
                else:
                    getter.cancel()
            try:
                record = task.result()
            except WarrenError as exc:
                yield _line({"event": "error", "message": str(exc)})
            except Exception as exc:  # the stream is under way: report instead of cutting it
                yield _line({"event": "error", "message": f"internal error: {exc!r}"})
            else:
                yield _line({"event": "template", "template": template_body(record)})
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    return StreamingResponse(stream(), media_type="application/x-ndjson")


ROUTES = [Route("/warren/images/pull", pull_image, methods=["POST"])]

"""E2B's sandbox logs: ``GET /v2/sandboxes/{id}/logs`` and the older ``GET /sandboxes/{id}/logs``.

warren's logs of a sandbox are its start command's output (``fields.source`` ``start``, ``stream``
stdout or stderr; stderr lines are level ``error``) and its guest agent's log (``source`` ``agent``;
those lines carry the log file's modification time). v2: ``cursor`` (ms since the epoch), ``limit``
(0-1000, default 1000), ``direction`` (``forward`` oldest first, default; ``backward`` newest first),
``level`` (the lowest to return), ``search`` (a substring, at most 256 characters). v1: ``start``
(ms) and ``limit``; answers ``{logs: [{timestamp, line}], logEntries}``.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...errors import InvalidRequestError
from ...ints import parse_optional_int
from ...orchestrator.sandboxlogs import LogLine
from ...templates.buildlog import rfc3339
from ..services import services

MAX_LIMIT = 1000
LEVELS = ("debug", "info", "warn", "error")


def _entry(line: LogLine) -> dict[str, Any]:
    return {"timestamp": rfc3339(line.at), "level": line.level, "message": line.text,
            "fields": {"source": line.source, "stream": line.stream}}  # fmt: skip


def _int(request: Request, name: str, maximum: int | None = None) -> int | None:
    return parse_optional_int(request.query_params.get(name), name, minimum=0, maximum=maximum,
                              error=InvalidRequestError)  # fmt: skip


async def logs_v2(request: Request) -> Response:
    q = request.query_params
    cursor, limit = _int(request, "cursor"), _int(request, "limit", MAX_LIMIT)
    direction = q.get("direction", "forward")
    if direction not in ("forward", "backward"):
        raise InvalidRequestError("direction must be forward or backward")
    level = q.get("level")
    if level is not None and level not in LEVELS:
        raise InvalidRequestError(f"level must be one of {', '.join(LEVELS)}")
    search = q.get("search")
    if search is not None and len(search) > 256:
        raise InvalidRequestError("search is at most 256 characters")
    lines = await services(request).manager.sandbox_logs(request.path_params["sandbox_id"])
    if direction == "backward":
        lines.reverse()
    if cursor is not None:
        lines = [ln for ln in lines if (ln.at * 1000 >= cursor if direction == "forward" else ln.at * 1000 <= cursor)]
    if level is not None:
        lines = [ln for ln in lines if LEVELS.index(ln.level) >= LEVELS.index(level)]
    if search:
        lines = [ln for ln in lines if search in ln.text]
    return JSONResponse({"logs": [_entry(ln) for ln in lines[: MAX_LIMIT if limit is None else limit]]})


async def logs_v1(request: Request) -> Response:
    start, limit = _int(request, "start"), _int(request, "limit")
    lines = await services(request).manager.sandbox_logs(request.path_params["sandbox_id"])
    if start is not None:
        lines = [ln for ln in lines if ln.at * 1000 >= start]
    lines = lines[: MAX_LIMIT if limit is None else limit]
    return JSONResponse({"logs": [{"timestamp": rfc3339(ln.at), "line": ln.text} for ln in lines],
                         "logEntries": [_entry(ln) for ln in lines]})  # fmt: skip


ROUTES = [
    Route("/v2/sandboxes/{sandbox_id}/logs", logs_v2, methods=["GET"]),
    Route("/sandboxes/{sandbox_id}/logs", logs_v1, methods=["GET"]),
]

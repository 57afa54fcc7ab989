"""THE table from warren errors to HTTP statuses, and the JSON error responses built from it."""

from __future__ import annotations

import logging
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import (
    AuthenticationError,
    ConflictError,
    ForbiddenError,
    GoneError,
    HostError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    TooManyRequestsError,
    UnavailableError,
    WarrenError,
)

log = logging.getLogger(__name__)

STATUS: dict[type[WarrenError], int] = {
    InvalidRequestError: 400,
    AuthenticationError: 401,
    ForbiddenError: 403,
    NotFoundError: 404,
    ConflictError: 409,
    GoneError: 410,
    PayloadTooLargeError: 413,
    TooManyRequestsError: 429,
    UnavailableError: 503,
    HostError: 500,
}


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """``{"code": status, "message": message}``: the body every E2B client parses."""
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)


def status_for(exc: WarrenError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


async def warren_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, WarrenError)
    status = status_for(exc)
    if status >= 500:
        log.warning("%s %s failed: %s", request.method, request.url.path, exc)
    # The SDK retries 503 unless told not to; a missing capability will not appear on retry.
    return error_response(status, str(exc), headers={"Should-Retry": "false"})


async def unhandled_error_handler(request: Request, exc: Exception) -> Response:
    error_id = uuid.uuid4().hex[:12]
    log.exception("unhandled error %s on %s %s", error_id, request.method, request.url.path)
    return error_response(500, f"internal error (id {error_id})")

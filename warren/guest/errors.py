"""Errors the agent answers with, and the one table that maps OS errors onto them.

``RpcError`` carries a Connect code (``not_found``, ``already_exists``, ...). RPC handlers raise it and
the Connect layer turns it into an HTTP status plus ``{"code", "message"}``; the plain HTTP routes
raise ``HttpError`` with a status instead.
"""

from __future__ import annotations

import errno

CONNECT_HTTP_STATUS: dict[str, int] = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}
"""Connect's code -> HTTP status mapping for unary error responses."""

_ERRNO_CODES: dict[int, str] = {
    errno.ENOENT: "not_found",
    errno.EEXIST: "already_exists",
    errno.ENOTEMPTY: "already_exists",
    errno.EACCES: "permission_denied",
    errno.EPERM: "permission_denied",
    errno.EROFS: "permission_denied",
    errno.ENOTDIR: "invalid_argument",
    errno.EISDIR: "invalid_argument",
    errno.EINVAL: "invalid_argument",
    errno.ENAMETOOLONG: "invalid_argument",
    errno.EXDEV: "invalid_argument",
    errno.ELOOP: "failed_precondition",
    errno.ENOSPC: "resource_exhausted",
    errno.EDQUOT: "resource_exhausted",
}


class RpcError(Exception):
    """A Connect error: ``code`` is one of ``CONNECT_HTTP_STATUS``'s keys."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return CONNECT_HTTP_STATUS.get(self.code, 500)

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class HttpError(Exception):
    """An error of a plain HTTP route, answered as ``{"message", "code"}`` with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def code_for_os_error(exc: OSError) -> str:
    """The Connect code for an OS error (``internal`` when nothing more specific fits)."""
    return _ERRNO_CODES.get(exc.errno or 0, "internal")


def rpc_error_from_os(exc: OSError, what: str) -> RpcError:
    """Wrap ``exc`` as an ``RpcError`` whose message names ``what`` was being done."""
    reason = exc.strerror or str(exc)
    target = f" '{exc.filename}'" if exc.filename else ""
    return RpcError(code_for_os_error(exc), f"{what}{target}: {reason}")

"""``GET /files`` (download) and ``POST /files`` (upload), streamed to and from disk in chunks.

Both accept ``X-Access-Token`` or, instead, a ``v1_`` signature over the path, operation, user and
token (the SDK's ``download_url``/``upload_url``).
"""

from __future__ import annotations

import asyncio
import base64
import errno
import logging
import os
import stat
import time
import zlib
from _operator import _compare_digest
from collections.abc import Awaitable, Callable
from typing import BinaryIO

from . import metadata as meta
from .errors import HttpError
from .server import Request, Response
from .state import Agent
from .users import PathError, User, chown, ensure_dirs, resolve_path

_log = logging.getLogger(__name__)

CHUNK = 64 * 1024
GZIP_LEVEL = 1
"""Fast compression: the agent shares the sandbox's CPU with the workload."""

_CONTENT_TYPES = {
    ".txt": "text/plain; charset=utf-8",
    ".md": "text/markdown; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".csv": "text/csv; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".xml": "text/xml; charset=utf-8",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".svg": "image/svg+xml",
    ".pdf": "application/pdf",
    ".zip": "application/zip",
    ".gz": "application/gzip",
    ".tar": "application/x-tar",
}


def make_signature(path: str, operation: str, username: str, token: str, expiration: str | None) -> str:
    raw = f"{path}:{operation}:{username}:{token}"
    if expiration is not None:
        raw += f":{expiration}"
    import hashlib  # only here: it maps libcrypto

    digest = hashlib.sha256(raw.encode()).digest()
    return "v1_" + base64.b64encode(digest).decode("ascii").rstrip("=")


def authorize(agent: Agent, request: Request, operation: str) -> None:
    """envd's rule: a matching X-Access-Token, or a valid unexpired signature; 401 otherwise."""
    token = agent.access_token
    if token is None:
        return
    presented = request.header("x-access-token")
    if presented:
        if not agent.token_matches(presented):
            raise HttpError(401, "access token present in header but does not match")
        return
    signature = request.query.get("signature")
    if signature is None:
        raise HttpError(401, "missing signature query parameter")
    expiration = request.query.get("signature_expiration")
    expected = make_signature(
        request.query.get("path", ""), operation, request.query.get("username", ""), token, expiration
    )
    if not _compare_digest(expected.encode(), signature.encode()):
        raise HttpError(401, "invalid signature")
    if expiration is not None:
        try:
            expired = int(expiration) < time.time()
        except ValueError:
            raise HttpError(401, "invalid signature expiration") from None
        if expired:
            raise HttpError(401, "signature is already expired")


def _user(agent: Agent, request: Request) -> User:
    name = request.query.get("username") or None
    user = agent.user(name)
    if user is None:
        raise HttpError(401, f"error looking up user '{name or agent.default_username()}': unknown user")
    return user


def _resolve(agent: Agent, user: User, path: str) -> str:
    try:
        return resolve_path(path, user, agent.default_workdir)
    except PathError as exc:
        raise HttpError(400, f"error expanding and resolving path '{path}': {exc}") from None


def _accept_gzip(header: str) -> bool:
    """envd's Accept-Encoding negotiation (gzip is the one encoding it offers); 406 if nothing fits."""
    if not header:
        return False
    prefs: list[tuple[float, str]] = []
    for item in header.split(","):
        name, _, params = item.partition(";")
        q = 1.0
        for param in params.split(";"):
            param = param.strip()
            if param.lower().startswith("q="):
                try:
                    q = float(param[2:])
                except ValueError:
                    pass
        prefs.append((q, name.strip().lower()))
    prefs.sort(key=lambda p: -p[0])
    identity_rejected = any(name == "identity" and q == 0 for q, name in prefs)
    for q, name in prefs:
        if q == 0:
            continue
        if name == "identity":
            return False
        if name == "*":
            return identity_rejected
        if name == "gzip":
            return True
    if identity_rejected:
        raise HttpError(406, "no acceptable encoding found, supported: [gzip]")
    return False


def _disposition(name: str) -> str:
    if name.isascii() and '"' not in name and "\\" not in name:
        return f'inline; filename="{name}"'
    from urllib.parse import quote

    return f"inline; filename*=UTF-8''{quote(name, safe='')}"


def _open_for_download(path: str) -> tuple[BinaryIO, os.stat_result]:
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise HttpError(404, f"path '{path}' does not exist") from None
    except IsADirectoryError:
        raise HttpError(400, f"path '{path}' is a directory") from None
    except OSError as exc:
        raise HttpError(500, f"error opening file '{path}': {exc}") from None
    st = os.fstat(f.fileno())
    if stat.S_ISDIR(st.st_mode):
        f.close()
        raise HttpError(400, f"path '{path}' is a directory")
    return f, st


async def get_files(agent: Agent, request: Request, response: Response) -> None:
    authorize(agent, request, "read")
    user = _user(agent, request)
    path = _resolve(agent, user, request.query.get("path", ""))
    f, st = _open_for_download(path)
    with f:
        gzip = _accept_gzip(request.header("accept-encoding"))
        name = os.path.basename(path)
        headers = [
            ("Content-Type", _CONTENT_TYPES.get(os.path.splitext(name)[1].lower(), "application/octet-stream")),
            ("Content-Disposition", _disposition(name)),
            ("Vary", "Accept-Encoding"),
            ("Last-Modified", time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(st.st_mtime))),
        ]
        if gzip:
            headers.append(("Content-Encoding", "gzip"))
            await response.start(200, headers)
            comp = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
            while chunk := f.read(CHUNK):
                await response.write(comp.compress(chunk))
            await response.write(comp.flush())
            await response.end()
            return
        size = st.st_size if stat.S_ISREG(st.st_mode) else None
        if size is None:
            await response.start(200, headers)
            while chunk := f.read(CHUNK):
                await response.write(chunk)
            await response.end()
            return
        await response.start(200, headers, length=size)
        left = size
        while left > 0:
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                response.keep_alive = False  # the file shrank: the length we promised is a lie
                break
            left -= len(chunk)
            await response.write(chunk)
        await response.end()


# --------------------------------------------------------------------------- upload


Reader = Callable[[], Awaitable[bytes]]
UPLOAD_IDLE_TIMEOUT_S = 60.0
"""An upload that sends nothing for this long is abandoned (envd bounds stalled uploads too)."""


async def _read_body(request: Request, n: int) -> bytes:
    try:
        async with asyncio.timeout(UPLOAD_IDLE_TIMEOUT_S):
            return await request.body.read(n)
    except TimeoutError:
        raise HttpError(408, f"no upload data for {UPLOAD_IDLE_TIMEOUT_S:.0f} s") from None


def _body_reader(request: Request) -> Reader:
    """The request body, gunzipped when ``Content-Encoding: gzip``; chunks of bounded size."""
    encoding = request.header("content-encoding").split(";")[0].strip().lower()
    if encoding in ("", "identity"):

        async def plain() -> bytes:
            return await _read_body(request, CHUNK)

        return plain
    if encoding != "gzip":
        raise HttpError(400, f"unsupported Content-Encoding: {encoding}, supported: [gzip]")
    return _Gunzip(request).read


class _Gunzip:
    """Streams a gzip request body (possibly several members), at most ``CHUNK`` bytes a call."""

    def __init__(self, request: Request) -> None:
        self._request = request
        self._d = zlib.decompressobj(31)

    def _decompress(self, data: bytes) -> bytes:
        try:
            return self._d.decompress(data, CHUNK)
        except zlib.error as exc:
            raise HttpError(400, f"error decompressing request body: {exc}") from None

    async def read(self) -> bytes:
        while True:
            if self._d.unconsumed_tail:
                return self._decompress(self._d.unconsumed_tail)
            if self._d.eof and self._d.unused_data:
                rest = self._d.unused_data
                self._d = zlib.decompressobj(31)  # another gzip member follows
                if out := self._decompress(rest):
                    return out
                continue
            data = await _read_body(self._request, CHUNK)
            if not data:
                if not self._d.eof:
                    raise HttpError(400, "error decompressing request body: unexpected EOF")
                return b""
            if out := self._decompress(data):
                return out


def _metadata(request: Request) -> dict[str, str]:
    found = meta.from_headers(request.headers)
    try:
        meta.validate(found)
    except meta.MetadataError as exc:
        raise HttpError(400, f"invalid metadata: {exc}") from None
    return found


def _store_metadata(fd: int, path: str, metadata: dict[str, str]) -> None:
    """Replace the file's metadata (always: an upload without any clears what an earlier one set)."""
    try:
        if not meta.write(fd, metadata) and metadata:
            _log.warning("%s: the filesystem has no extended attributes; metadata not stored", path)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.E2BIG):
            raise HttpError(507, f"not enough space for file metadata: {exc}") from None
        raise HttpError(500, f"error writing file metadata: {exc}") from None


async def _write_file(path: str, read: Reader, user: User, metadata: dict[str, str]) -> None:
    """Write one uploaded file: parents created (and chowned), file truncated, owned by ``user``."""
    try:
        ensure_dirs(os.path.dirname(path) or "/", user.uid, user.gid)
    except OSError as exc:
        raise HttpError(500, f"error ensuring directories: {exc}") from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    except IsADirectoryError:
        raise HttpError(400, f"path is a directory: {path}") from None
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise HttpError(507, f"not enough inodes available: {exc}") from None
        raise HttpError(500, f"error opening file: {exc}") from None
    try:
        try:
            chown(path, user.uid, user.gid)
        except OSError as exc:
            raise HttpError(500, f"error changing file ownership: {exc}") from None
        while data := await read():
            view = memoryview(data)
            while view:
                try:
                    n = os.write(fd, view)
                except OSError as exc:
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                        raise HttpError(507, "not enough disk space available") from None
                    raise HttpError(500, f"error writing file: {exc}") from None
                view = view[n:]
        _store_metadata(fd, path, metadata)
    finally:
        os.close(fd)


def _entry(path: str) -> dict[str, object]:
    """The upload's answer for one file; its metadata is read back, so it shows what was stored."""
    entry: dict[str, object] = {"name": os.path.basename(path), "type": "file", "path": path}
    stored = meta.read(path)
    if stored:
        entry["metadata"] = stored
    return entry


async def post_files(agent: Agent, request: Request, response: Response) -> None:
    authorize(agent, request, "write")
    user = _user(agent, request)
    read = _body_reader(request)
    media, _, params = request.header("content-type").partition(";")
    media = media.strip().lower()
    metadata = _metadata(request)
    query_path = request.query.get("path")
    written: list[dict[str, object]] = []
    if media == "application/octet-stream":
        if query_path is None:
            raise HttpError(400, "path query parameter is required for raw body upload")
        path = _resolve(agent, user, query_path)
        await _write_file(path, read, user, metadata)
        written.append(_entry(path))
    elif media.startswith("multipart/"):
        from .multipart import MultipartError, MultipartReader, parse_disposition

        boundary = ""
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.lower() == "boundary":
                boundary = value.strip().strip('"')
        try:
            parts = MultipartReader(read, boundary)
            while (headers := await parts.next_part()) is not None:
                disposition = parse_disposition(headers.get("content-disposition", ""))
                if disposition.get("name") != "file":
                    continue
                target = query_path if query_path is not None else disposition.get("filename", "")
                if not target:
                    raise HttpError(400, "a file part needs a filename (its path) or the path query")
                path = _resolve(agent, user, target)
                if any(w["path"] == path for w in written):
                    raise HttpError(
                        400,
                        f"you cannot upload multiple files to the same path '{path}' in one upload request",
                    )
                await _write_file(path, parts.read, user, metadata)
                written.append(_entry(path))
        except MultipartError as exc:
            raise HttpError(400, f"error parsing multipart form: {exc}") from None
    else:
        raise HttpError(
            400,
            f"unsupported content type: {request.header('content-type')}, "
            "expected multipart/form-data or application/octet-stream",
        )
    await response.send_json(200, written)

"""Control-plane calls from a gateway to a node: one pooled HTTP client, requests passed through as-is."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
from starlette.requests import Request
from starlette.responses import Response

from ...errors import UnavailableError

_DROP = frozenset(
    {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "content-encoding",
     "proxy-authorization", "proxy-authenticate", "trailer", "date", "server"}
)  # fmt: skip


class NodeUnreachable(UnavailableError):
    """A node did not answer (refused, reset, timed out)."""


class NodeClient:
    def __init__(self) -> None:
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=3.0, read=600.0, write=60.0, pool=30.0),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=128),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def call(
        self,
        base_url: str,
        method: str,
        path: str,
        *,
        headers: list[tuple[str, str]],
        params: list[tuple[str, str]] | None = None,
        body: bytes = b"",
    ) -> httpx.Response:
        try:
            return await self._http.request(
                method,
                base_url.rstrip("/") + path,
                headers=headers,
                params=httpx.QueryParams(tuple(params or ())),
                content=body or None,
            )
        except httpx.HTTPError as exc:
            raise NodeUnreachable(f"node at {base_url} did not answer: {type(exc).__name__}: {exc}") from exc

    async def open(
        self,
        base_url: str,
        method: str,
        path: str,
        *,
        headers: list[tuple[str, str]],
        params: list[tuple[str, str]] | None = None,
        body: bytes | AsyncIterator[bytes] = b"",
        timeouts: httpx.Timeout | None = None,
    ) -> httpx.Response:
        """Like :meth:`call`, but the answer's body is left to stream (the caller closes it) and the request
        body may be a stream too (sent chunked). ``timeouts`` replace the client's for this call."""
        request = self._http.build_request(
            method,
            base_url.rstrip("/") + path,
            headers=headers,
            params=httpx.QueryParams(tuple(params or ())),
            content=body or None,
            timeout=timeouts or self._http.timeout,
        )
        try:
            return await self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise NodeUnreachable(f"node at {base_url} did not answer: {type(exc).__name__}: {exc}") from exc

    async def forward(self, base_url: str, request: Request, body: bytes, *, path: str | None = None) -> httpx.Response:
        """``request`` as it came (method, path, query, headers but hop-by-hop ones), to ``base_url``."""
        return await self.call(
            base_url,
            request.method,
            path or request.url.path,
            headers=passed_headers(request),
            params=list(request.query_params.multi_items()),
            body=body,
        )


def passed_headers(request: Request) -> list[tuple[str, str]]:
    return [(k, v) for k, v in request.headers.items() if k.lower() not in _DROP]


def relay(answer: httpx.Response, content: bytes | None = None) -> Response:
    """A node's answer, back to the client (with ``content`` for its body when given)."""
    headers = {k: v for k, v in answer.headers.items() if k.lower() not in _DROP}
    return Response(answer.content if content is None else content, status_code=answer.status_code, headers=headers)

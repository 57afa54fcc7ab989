"""A small synchronous client for warren's REST API (the E2B control plane plus ``/warren/*``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from types import TracebackType
from typing import IO, Any, Self

import httpx

from warren.cli.config import ClientConfig

REQUEST_TIMEOUT_S = 60.0
"""The E2B SDK's default request timeout; create and import can take this long on a busy node."""

MAX_PAGES = 1000
"""A server that keeps sending next-tokens is broken; stop instead of looping forever."""


class CliError(Exception):
    """A failure to show the user as one red line, then exit non-zero."""


class ApiError(CliError):
    """The server answered with an error status (body ``{"code", "message"}`` when it is warren)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class ApiClient:
    """``with ApiClient(config) as api: api.get("/v2/sandboxes")``; errors raise ``CliError``."""

    def __init__(self, config: ClientConfig, *, transport: httpx.BaseTransport | None = None) -> None:
        headers = {"X-API-KEY": config.api_key} if config.api_key else {}
        self.url = config.url
        self._http = httpx.Client(base_url=config.url, headers=headers, timeout=REQUEST_TIMEOUT_S, transport=transport)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._http.close()

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: dict[str, Any], *, timeout: float = REQUEST_TIMEOUT_S) -> Any:
        return _decode(self._send("POST", path, body=body, timeout=timeout), "POST", path)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def list_all(self, path: str, query: dict[str, str] | None = None) -> list[Any]:
        """GET a paginated E2B list, following ``x-next-token`` until the server stops sending one."""
        items: list[Any] = []
        params: dict[str, str] = dict(query or {})
        for _ in range(MAX_PAGES):
            response = self._send("GET", path, params=params)
            page = _decode(response, "GET", path)
            if not isinstance(page, list):
                raise CliError(f"GET {path}: expected a JSON list from the server")
            items.extend(page)
            token = response.headers.get("x-next-token")
            if not token or not page:
                break
            params = {**(query or {}), "nextToken": token}
        return items

    def put_content(self, url: str, content: IO[bytes], headers: dict[str, str], *, timeout: float) -> None:
        """PUT a file to an absolute URL the server handed out (an upload link), with its headers."""
        size = os.fstat(content.fileno()).st_size
        try:
            response = self._http.put(url, content=content, headers={**headers, "Content-Length": str(size)},
                                      timeout=timeout)  # fmt: skip
        except httpx.HTTPError as exc:
            raise CliError(f"uploading to {url} failed: {exc}") from exc
        if response.is_error:
            raise ApiError(response.status_code, error_message(response))

    def stream_lines(self, path: str, body: dict[str, Any], *, timeout: float) -> Iterator[Any]:
        """POST and yield the JSON objects of an NDJSON answer, line by line, as they arrive."""
        try:
            with self._http.stream("POST", path, json=body, timeout=httpx.Timeout(timeout, read=None)) as response:
                if response.is_error:
                    response.read()
                    raise ApiError(response.status_code, error_message(response))
                for line in response.iter_lines():
                    if line.strip():
                        try:
                            yield json.loads(line)
                        except ValueError as exc:
                            raise CliError(f"POST {path}: the server sent a line that is not JSON") from exc
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach the warren server at {self.url}: {exc}") from exc

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """Send one request; return the decoded JSON body (None when empty)."""
        return _decode(self._send(method, path, body=body), method, path)

    def _send(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        timeout: float = REQUEST_TIMEOUT_S,
    ) -> httpx.Response:
        try:
            response = self._http.request(method, path, json=body, params=params, timeout=timeout)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach the warren server at {self.url}: {exc}") from exc
        if response.is_error:
            raise ApiError(response.status_code, error_message(response))
        return response


def _decode(response: httpx.Response, method: str, path: str) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError as exc:
        raise CliError(f"{method} {path}: the server sent a body that is not JSON") from exc


def error_message(response: httpx.Response) -> str:
    """The ``message`` of a JSON error body, else the body text, else the reason phrase."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return response.text.strip()[:500] or response.reason_phrase

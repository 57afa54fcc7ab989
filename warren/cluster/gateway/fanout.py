"""Per-node operations through a gateway: each runs on every live node at once, and one answer comes back.

``/warren/templates/import``, ``/warren/templates/ensure``, ``/warren/images/pull``, ``POST /warren/runtimes``
and ``/warren/runtimes/reload`` change one node's local state, so the gateway runs them on every live node
(a node that is down does not get them: run them again, or on that node, once it is back);
``/warren/templates/{id}/pool`` runs on the nodes that hold the template. The answer:

* every node succeeded: the first node's answer (nodes in id order);
* every node refused with the same 4xx (a bad request, a name taken everywhere): that answer;
* otherwise 502 (503 when the failing nodes only did not answer) whose message names each failing node
  with its status and message.

A streamed answer (NDJSON: ``ensure`` can build for minutes, ``pull`` downloads) is merged as it comes:
each node's lines with ``"node": id`` added, its own last line (``template`` or ``error``) turned into a
``log`` line, then one last line of the gateway's: the first node's ``template``, or an ``error`` naming
each node that failed. Clients read the first ``template`` or ``error`` as the end, as they do from a node.

Also here: ``GET /runtimes`` (merged), ``GET /openapi.json`` (the nodes' document) and the answer to
routes no node serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ...api.errors import error_response
from ...api.openapi import OPENAPI
from ...errors import NotFoundError, UnavailableError
from ..records import NodeView
from .upstream import passed_headers, relay

if TYPE_CHECKING:
    from .routes import Gateway

FANOUT_CONCURRENCY = 16
"""Requests a gateway has open to nodes for one operation before their answers start (the rest wait)."""

ADMIN_TIMEOUT = httpx.Timeout(connect=3.0, read=1800.0, write=60.0, pool=30.0)
"""Per call, and per read of a stream: an import copies a rootfs, ``ensure`` builds quietly for minutes."""

_NDJSON = "application/x-ndjson"
_TERMINAL = ("template", "error")


def _gateway(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


@dataclass
class _Answer:
    node: NodeView
    response: httpx.Response | None
    """None: the node did not answer (``error`` says how)."""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.response is not None and self.response.status_code < 300

    @property
    def streams(self) -> bool:
        r = self.response
        return r is not None and r.status_code == 200 and r.headers.get("content-type", "").startswith(_NDJSON)

    def failure(self) -> str:
        """``node-a: 409 template 'x' exists already`` (the node's message, or its status alone)."""
        if self.response is None:
            return f"{self.node.node_id}: did not answer ({self.error})"
        message = ""
        with contextlib.suppress(ValueError, AttributeError):
            message = str(json.loads(self.response.content).get("message", ""))
        return f"{self.node.node_id}: {self.response.status_code} {message or self.response.text[:200]}".rstrip()


def live_nodes(nodes: Sequence[NodeView]) -> list[NodeView]:
    live = [v for v in nodes if v.alive]
    if not live:
        raise UnavailableError("no live node in the cluster")
    return live


async def on_every_node(request: Request) -> Response:
    """An admin operation that changes one node's state: on every live node."""
    gw = _gateway(request)
    return await fan_out(gw, request, await request.body(), live_nodes(await gw.directory.nodes(fresh=True)))


async def on_template_holders(request: Request) -> Response:
    """``/warren/templates/{id}/pool``: on each live node that holds the template."""
    gw = _gateway(request)
    ref = request.path_params["template_id"]
    nodes = live_nodes(await gw.directory.nodes(fresh=True))
    built_on = await gw.directory.store.template_node(ref)
    holders = [v for v in nodes if v.info.template(ref) is not None or v.node_id == built_on]
    if not holders:
        raise NotFoundError(f"template '{ref}' not found")
    return await fan_out(gw, request, await request.body(), holders)


async def fan_out(gw: Gateway, request: Request, body: bytes, nodes: Sequence[NodeView]) -> Response:
    """``request`` on each of ``nodes`` concurrently (bounded); one answer, as the module docstring says."""
    limit = asyncio.Semaphore(FANOUT_CONCURRENCY)
    headers = passed_headers(request)
    params = list(request.query_params.multi_items())

    async def one(view: NodeView) -> _Answer:
        async with limit:
            try:
                response = await gw.client.open(view.info.url, request.method, request.url.path, headers=headers,
                                                params=params, body=body, timeouts=ADMIN_TIMEOUT)  # fmt: skip
            except UnavailableError as exc:
                return _Answer(view, None, str(exc))
            answer = _Answer(view, response)
            if not answer.streams:
                try:
                    await response.aread()
                except httpx.HTTPError as exc:
                    return _Answer(view, None, f"{type(exc).__name__}: {exc}")
                finally:
                    await response.aclose()
            return answer

    answers = list(await asyncio.gather(*(one(v) for v in nodes)))
    if any(a.streams for a in answers):
        return StreamingResponse(_merged(answers, request), media_type=_NDJSON)
    return _one_answer(answers, request)


def _one_answer(answers: list[_Answer], request: Request) -> Response:
    if len(answers) == 1 and answers[0].response is not None:
        return relay(answers[0].response)
    if all(a.ok for a in answers):
        first = answers[0].response
        assert first is not None
        return relay(first)
    failed = [a for a in answers if not a.ok]
    statuses = {a.response.status_code if a.response is not None else 0 for a in failed}
    if len(failed) == len(answers) and len(statuses) == 1 and 400 <= min(statuses) < 500:
        first = failed[0].response
        assert first is not None
        return relay(first)  # the same refusal everywhere: the request's fault, answered as a node would
    status = 503 if statuses <= {0, 503} else 502
    return error_response(status, _summary(request, answers, [a.failure() for a in failed]))


def _summary(request: Request, answers: list[_Answer], failures: list[str]) -> str:
    done = len(answers) - len(failures)
    return (
        f"{request.method} {request.url.path} failed on {len(failures)} of {len(answers)} nodes"
        f"{f' (it succeeded on {done})' if done else ''}: {'; '.join(failures)}"
    )


def _line(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


async def _merged(answers: list[_Answer], request: Request) -> AsyncIterator[bytes]:
    """The nodes' NDJSON streams, line by line as they come, then the gateway's own last line."""
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()  # lines are small; a node sends them as it works
    results: dict[str, dict[str, Any]] = {}

    async def pump(answer: _Answer) -> None:
        node_id, response = answer.node.node_id, answer.response
        assert response is not None
        last: dict[str, Any] = {"event": "error", "message": "the node ended its stream without a result"}
        try:
            async for text in response.aiter_lines():
                if not text.strip():
                    continue
                try:
                    doc = dict(json.loads(text))
                except (ValueError, TypeError):
                    doc = {"event": "log", "message": text}
                if doc.get("event") in _TERMINAL:
                    last = doc
                    outcome = "done" if doc["event"] == "template" else f"failed: {doc.get('message', '')}"
                    doc = {"event": "log", "message": f"{node_id}: {outcome}"}
                queue.put_nowait(_line({**doc, "node": node_id}))
        except httpx.HTTPError as exc:
            last = {"event": "error", "message": f"its stream broke: {type(exc).__name__}: {exc}"}
        finally:
            results[node_id] = last
            queue.put_nowait(None)
            await response.aclose()

    streaming = [a for a in answers if a.streams]
    failures = [a.failure() for a in answers if not a.streams]
    for failure in failures:
        yield _line({"event": "log", "message": failure, "node": failure.partition(":")[0]})
    try:
        async with asyncio.TaskGroup() as group:
            for answer in streaming:
                group.create_task(pump(answer), name=f"fan-out stream {answer.node.node_id}")
            open_streams = len(streaming)
            while open_streams:
                item = await queue.get()
                if item is None:
                    open_streams -= 1
                else:
                    yield item
    finally:
        for answer in streaming:  # a client that went away: the nodes' streams close (a pull is cancelled)
            if answer.response is not None:
                await answer.response.aclose()
    for answer in streaming:
        last = results.get(answer.node.node_id, {})
        if last.get("event") != "template":
            failures.append(f"{answer.node.node_id}: {last.get('message', 'no result')}")
    if failures:
        yield _line({"event": "error", "message": _summary(request, answers, failures)})
    else:
        yield _line(results[streaming[0].node.node_id])


async def list_runtimes(request: Request) -> Response:
    """``GET /runtimes``, merged: each runtime hash once (as the first node listing it describes it), with
    ``nodes`` (the live nodes that have it) and ``defaultOn`` (those where it is its class's default);
    ``default`` when it is the default on every one of them.

    Merged, not one node's: a hash is what a snapshot needs to restore (placement sends a restore only to a
    node that has it), so the cluster's answer is which hashes exist and where; one node's list would hide
    the runtimes only other nodes have. A node that does not answer is named in ``X-Warren-Partial``."""
    gw = _gateway(request)
    nodes = live_nodes(await gw.directory.nodes(fresh=True))
    headers = passed_headers(request)

    async def ask(view: NodeView) -> list[dict[str, Any]] | None:
        try:
            answer = await gw.client.call(view.info.url, "GET", "/runtimes", headers=headers)
        except UnavailableError:
            return None
        return list(answer.json()) if answer.status_code == 200 else None

    merged: dict[str, dict[str, Any]] = {}
    missing = []
    for view, runtimes in zip(nodes, await asyncio.gather(*(ask(v) for v in nodes)), strict=True):
        if runtimes is None:
            missing.append(view.node_id)
            continue
        for runtime in runtimes:
            entry = merged.setdefault(str(runtime["hash"]), {**runtime, "nodes": [], "defaultOn": []})
            entry["nodes"].append(view.node_id)
            if runtime.get("default"):
                entry["defaultOn"].append(view.node_id)
    for entry in merged.values():
        entry["default"] = entry["defaultOn"] == entry["nodes"]
    return JSONResponse(list(merged.values()), headers={"X-Warren-Partial": ",".join(missing)} if missing else None)


async def openapi(request: Request) -> Response:
    """The nodes' own document: the gateway serves the same API (``/nodes`` is the cluster's there)."""
    return JSONResponse(OPENAPI)


async def not_served(request: Request) -> Response:
    """A route no node serves either (E2B's secrets, volumes, legacy template builds, ...): 501, saying so."""
    return error_response(
        501,
        f"{request.method} {request.url.path} is not part of warren's API: no node serves it, so the gateway "
        "cannot either (GET /openapi.json lists the routes there are)",
    )

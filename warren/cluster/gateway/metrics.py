"""The gateway's Prometheus metrics (``GET /metrics``), in a registry of its own.

    warren_gateway_requests_total{route,code}   counter, HTTP requests by route class and status
    warren_gateway_request_seconds{route}       histogram, until the response started (a stream's length
                                                is not its latency)
    warren_placement_failures_total{reason}     counter, creates no node took: ``full`` (429: every node
                                                that could run it is at its cap), ``refused`` (503: the
                                                candidates refused or did not answer), ``no_candidate``
                                                (503: no live, non-draining node can run it),
                                                ``no_runtime`` (409: no node has the snapshot's runtime)
    warren_nodes{status}                        gauge, ready/draining/dead/stopped, read from Redis at scrape
    warren_redis_errors_total{operation}        counter, failed cluster-store calls (``ClusterStore(on_error=)``)
    process_*, python_info                      prometheus-client's process and platform collectors

Route classes (each route's ``name`` in ``routes.py``): ``create``, ``list`` (sandboxes, batch metrics,
snapshot, template and runtime lists), ``sandbox`` (any call on one sandbox), ``holder`` (a snapshot or
template by id), ``build`` (template builds, uploads, tags), ``admin`` (per-node operations on every node),
``nodes``, ``health``, ``metrics``, ``dataplane`` (sandbox traffic), ``other`` (refused before routing,
e.g. a 401; not served, 501; the OpenAPI document).
WebSockets are not counted.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence

from prometheus_client import Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...api.metrics import LATENCY_BUCKETS, RedisErrors, new_registry
from ..records import NodeView

NODE_STATUSES = ("ready", "draining", "dead", "stopped")


class PlacementFailure(enum.StrEnum):
    FULL = "full"  # 429: every node that can run it is at its cap (in Redis, or by its own answer)
    REFUSED = "refused"  # 503: candidates there were, and none took it (drain, no answer, its own 503)
    NO_CANDIDATE = "no_candidate"  # 503: no live, non-draining node can run it
    NO_RUNTIME = "no_runtime"  # 409: the snapshot's runtime hash is on no live node that holds it


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = new_registry()
        self._requests = Counter(
            "warren_gateway_requests", "HTTP requests by route class and status", ["route", "code"],
            registry=self.registry,
        )  # fmt: skip
        self._latency = Histogram(
            "warren_gateway_request_seconds", "Time until the response started, by route class", ["route"],
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self._placement = Counter(
            "warren_placement_failures", "Creates no node took, by reason", ["reason"], registry=self.registry
        )
        for reason in PlacementFailure:
            self._placement.labels(reason.value)
        self._nodes = Gauge("warren_nodes", "Nodes in the cluster by status", ["status"], registry=self.registry)
        self.redis_errors = RedisErrors(self.registry)
        self.redis_errors.expect(("list_nodes", "lookup", "reserve", "ping"))

    def request(self, route: str, code: int, seconds: float) -> None:
        self._requests.labels(route, str(code)).inc()
        self._latency.labels(route).observe(seconds)

    def placement_failed(self, reason: PlacementFailure) -> None:
        self._placement.labels(reason.value).inc()

    def nodes_seen(self, views: Sequence[NodeView] | None) -> None:
        """The cluster's nodes as read for a scrape; None (Redis away): no gauge rather than a stale one."""
        self._nodes.clear()
        if views is None:
            return
        for status in NODE_STATUSES:
            self._nodes.labels(status).set(sum(1 for v in views if v.status == status))


class RequestMetrics:
    """ASGI middleware: each HTTP request counted once, by ``classify(scope)`` (read when the response
    starts, after routing) and status; a request that raised is a 500."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, classify: Callable[[Scope], str]) -> None:
        self._app = app
        self._metrics = metrics
        self._classify = classify

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.monotonic()
        counted = False

        def count(code: int) -> None:
            nonlocal counted
            if not counted:
                counted = True
                self._metrics.request(self._classify(scope), code, time.monotonic() - started)

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                count(int(message["status"]))
            await send(message)

        try:
            await self._app(scope, receive, timed_send)
        finally:
            count(500)  # no response started: uvicorn answers 500 (or the client left)


__all__ = ["NODE_STATUSES", "GatewayMetrics", "PlacementFailure", "RequestMetrics"]

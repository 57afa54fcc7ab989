"""The node's Prometheus metrics (``GET /metrics``), each app with its own registry (never the process's
global one: several nodes and gateways share a test process).

    warren_sandboxes{state}                     gauge, every lifecycle state, read from the table at scrape
    warren_sandbox_limit                        gauge, the node's cap (WARREN_MAX_SANDBOXES; 0: none)
    warren_sandbox_active                       gauge, slots in use (running, pausing, creates and resumes)
    warren_sandbox_capacity                     gauge, free slots (limit - active; +Inf without a cap)
    warren_warm_pool_ready{template,runtime}    gauge, warm sandboxes ready to claim (and _target, the wanted
    warren_warm_pool_target{template,runtime}   size; _hits_total and _misses_total, creates that did or did
                                                not find one)
    warren_sandbox_operation_seconds{operation,runtime,outcome}   histogram, 1 ms .. 60 s
    warren_redis_errors_total{operation}        counter, the cluster heartbeat's failed Redis calls
    process_*, python_info                      prometheus-client's process and platform collectors

The orchestrator knows nothing of this: it calls :meth:`NodeMetrics.observe` through its observe seam
(``warren.orchestrator.observe``). ``GET /metrics`` needs no key unless ``WARREN_METRICS_PUBLIC=0``; then it
takes the API key as ``X-API-Key`` or ``Authorization: Bearer`` (what Prometheus's scrape config can send).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from starlette.datastructures import Headers
from starlette.responses import Response

from ..orchestrator.observe import Operation, Outcome
from .auth import key_matches

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The text format every Prometheus version reads."""

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""From a warm-pool claim or a freezer pause (milliseconds) to a gVisor restore or a cold create of a large
template (tens of seconds)."""


def new_registry() -> CollectorRegistry:
    """A registry of one app, with the process metrics prometheus-client gives for free."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


def metrics_allowed(headers: Headers, api_key: str, public: bool) -> bool:
    """Whether a scrape may read the metrics: anyone when public, else the API key in ``X-API-Key`` or as a
    bearer token."""
    if public or key_matches(api_key, headers.get("x-api-key")):
        return True
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and key_matches(api_key, token.strip())


def exposition(registry: CollectorRegistry) -> Response:
    return Response(generate_latest(registry), media_type=CONTENT_TYPE)


class RedisErrors:
    """``warren_redis_errors_total{operation}``: cluster-store calls that failed (``ClusterStore(on_error=)``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._counter = Counter(
            "warren_redis_errors", "Calls to the cluster store (Redis) that failed", ["operation"], registry=registry
        )

    def __call__(self, operation: str) -> None:
        self._counter.labels(operation).inc()

    def expect(self, operations: Iterable[str]) -> None:
        """Show these operations at 0 before any failed (a rate needs a first sample)."""
        for operation in operations:
            self._counter.labels(operation)


class NodeState(Protocol):
    """What the scrape-time collector reads (the ``SandboxManager``)."""

    def state_counts(self) -> Mapping[str, int]: ...

    def limits(self) -> Mapping[str, int]: ...

    def pool_stats(self) -> Mapping[str, Mapping[str, int]]: ...


class _NodeCollector(Collector):
    """Gauges read from the node's table at scrape time (nothing is counted up and down on the way)."""

    def __init__(self, state: NodeState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        sandboxes = GaugeMetricFamily("warren_sandboxes", "Sandboxes of this node by lifecycle state", labels=["state"])
        for state, count in sorted(self._state.state_counts().items()):
            sandboxes.add_metric([state], count)
        yield sandboxes
        limits = self._state.limits()
        cap, active = limits.get("max", 0), limits.get("active", 0)
        yield GaugeMetricFamily("warren_sandbox_limit", "The node's sandbox cap (0: none)", value=cap)
        yield GaugeMetricFamily("warren_sandbox_active", "Sandbox slots in use (running, pausing, starting)",
                                value=active)  # fmt: skip
        free = max(cap - active, 0) if cap > 0 else math.inf
        yield GaugeMetricFamily("warren_sandbox_capacity", "Free sandbox slots (+Inf: no cap)", value=free)
        labels = ["template", "runtime"]
        ready = GaugeMetricFamily("warren_warm_pool_ready", "Warm sandboxes ready to claim", labels=labels)
        target = GaugeMetricFamily("warren_warm_pool_target", "Wanted warm sandboxes", labels=labels)
        hits = CounterMetricFamily("warren_warm_pool_hits", "Creates that claimed a warm sandbox", labels=labels)
        misses = CounterMetricFamily("warren_warm_pool_misses", "Creates that found none ready", labels=labels)
        for key, shelf in sorted(self._state.pool_stats().items()):
            template, _, runtime = key.rpartition("/")
            ready.add_metric([template, runtime], shelf.get("ready", 0))
            target.add_metric([template, runtime], shelf.get("target", 0))
            hits.add_metric([template, runtime], shelf.get("hits", 0))
            misses.add_metric([template, runtime], shelf.get("misses", 0))
        yield from (ready, target, hits, misses)


class NodeMetrics:
    """One node's metrics: hand :meth:`observe` to the manager, :meth:`watch` the manager, serve :attr:`registry`."""

    def __init__(self) -> None:
        self.registry = new_registry()
        self._operations = Histogram(
            "warren_sandbox_operation_seconds",
            "How long sandbox lifecycle operations took",
            ["operation", "runtime", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.redis_errors = RedisErrors(self.registry)

    def observe(self, operation: Operation, runtime: str, outcome: Outcome, seconds: float) -> None:
        """The orchestrator's observe seam."""
        self._operations.labels(operation.value, runtime, outcome.value).observe(seconds)

    def watch(self, state: NodeState) -> None:
        """Read the sandbox gauges from ``state`` at every scrape (once per node)."""
        self.registry.register(_NodeCollector(state))


__all__ = [
    "CONTENT_TYPE",
    "LATENCY_BUCKETS",
    "NodeMetrics",
    "NodeState",
    "RedisErrors",
    "exposition",
    "metrics_allowed",
    "new_registry",
]

"""A real node's ``GET /metrics``: a create, pause, resume and kill of a real sandbox (each runtime) show
up once each in the operation histogram, and the state gauge follows the sandbox; E2B's own metrics
routes are unchanged."""

from __future__ import annotations

import httpx

from tests.framework.node import Node
from tests.framework.prom import Samples, samples, value


def scrape(node: Node) -> Samples:
    r = httpx.get(f"{node.url}/metrics", verify=node.verify(), timeout=30)  # no key: public by default
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return samples(r.text)


def ops(scraped: Samples, runtime: str) -> dict[str, float]:
    """Observed operations on ``runtime`` that succeeded, by operation."""
    return {
        op: value(scraped, "warren_sandbox_operation_seconds_count", operation=op, runtime=runtime, outcome="ok")
        for op in ("create", "pause", "resume", "kill")
    }


def test_a_lifecycle_is_observed_once_per_operation(node: Node, template: str, runtime: str) -> None:
    before = scrape(node)
    with node.client() as c:
        r = c.post("/v2/sandboxes", json={"templateID": template, "timeout": 120})
        assert r.status_code == 201, r.text
        sid = r.json()["sandboxID"]
        try:
            running = scrape(node)
            assert value(running, "warren_sandboxes", state="running") >= 1
            assert value(running, "warren_sandbox_active") >= 1
            assert c.post(f"/sandboxes/{sid}/pause").status_code == 204
            paused = scrape(node)
            listed = c.get("/v2/sandboxes", params={"state": "paused"}).json()
            assert value(paused, "warren_sandboxes", state="paused") == len(listed) >= 1
            assert c.post(f"/sandboxes/{sid}/connect", json={"timeout": 120}).status_code == 201
            assert c.post(f"/sandboxes/{sid}/connect", json={"timeout": 120}).status_code == 200  # no resume
            assert c.get(f"/sandboxes/{sid}/metrics").status_code == 200  # E2B's routes, untouched
            assert c.get("/sandboxes/metrics", params={"sandbox_ids": sid}).status_code == 200
        finally:
            assert c.delete(f"/sandboxes/{sid}").status_code == 204
    after = scrape(node)
    grown = {op: after_n - ops(before, runtime)[op] for op, after_n in ops(after, runtime).items()}
    assert grown == {"create": 1, "pause": 1, "resume": 1, "kill": 1}
    assert value(after, "warren_sandboxes", state="paused") == value(before, "warren_sandboxes", state="paused")
    bucket = value(after, "warren_sandbox_operation_seconds_bucket", operation="create", runtime=runtime,
                   outcome="ok", le="+Inf")  # fmt: skip
    assert bucket == value(after, "warren_sandbox_operation_seconds_count", operation="create", runtime=runtime,
                           outcome="ok")  # fmt: skip
    assert value(after, "process_resident_memory_bytes") > 0

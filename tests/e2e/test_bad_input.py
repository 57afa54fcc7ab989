"""Bad input gets the documented status and a JSON error, and a failed create leaks nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from tests.framework import leaks
from tests.framework.node import DEFAULT_CACHE, Node


def _json_error(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == status and isinstance(body["message"], str) and body["message"]
    return body


def test_unknown_template(node: Node) -> None:
    with node.client() as c:
        body = _json_error(c.post("/v2/sandboxes", json={"templateID": "nope"}), 404)
    assert "nope" in str(body["message"])


def test_malformed_json_and_bad_fields(node: Node) -> None:
    with node.client() as c:
        _json_error(c.post("/v2/sandboxes", content=b"{not json", headers={"content-type": "application/json"}), 400)
        _json_error(c.post("/v2/sandboxes", json=["a"]), 400)
        _json_error(c.post("/v2/sandboxes", json={"templateID": "base", "timeout": "x"}), 400)
        _json_error(c.post("/v2/sandboxes", json={"templateID": "base", "metadata": {"a": 1}}), 400)
        _json_error(c.get("/v2/sandboxes", params={"limit": "zero"}), 400)


def test_bad_integers_in_queries(node: Node) -> None:
    """Every integer query parameter goes through warren.ints: a 400 naming the parameter and its bounds."""
    with node.client() as c:
        for limit in ("0", "1001", "-1", "1.5"):
            body = _json_error(c.get("/v2/sandboxes", params={"limit": limit}), 400)
            assert "limit must be an integer between 1 and 1000" in str(body["message"])
            body = _json_error(c.get("/snapshots", params={"limit": limit}), 400)
            assert "limit must be an integer between 1 and 1000" in str(body["message"])
        status = "/templates/tnope/builds/bnope/status"
        body = _json_error(c.get(status, params={"logsOffset": "-1"}), 400)
        assert "logsOffset must be a non-negative integer" in str(body["message"])
        body = _json_error(c.get(status, params={"limit": "many"}), 400)
        assert "limit must be a non-negative integer, got 'many'" in str(body["message"])
        assert c.get("/v2/sandboxes", params={"limit": ""}).status_code == 200  # empty means unset


def test_api_key_required(node: Node) -> None:
    _json_error(httpx.get(f"{node.url}/v2/sandboxes"), 401)
    _json_error(httpx.get(f"{node.url}/v2/sandboxes", headers={"X-API-Key": "wrong"}), 401)
    assert httpx.get(f"{node.url}/health").status_code == 200


def test_unknown_sandbox(node: Node) -> None:
    with node.client() as c:
        _json_error(c.get("/sandboxes/inope"), 404)
        _json_error(c.delete("/sandboxes/inope"), 404)
        _json_error(c.post("/sandboxes/inope/timeout", json={"timeout": 10}), 404)
        _json_error(c.post("/v2/sandboxes/inope/connect", json={}), 404)


def test_proxy_to_unknown_sandbox(node: Node) -> None:
    r = httpx.get(f"{node.url}/health", headers={"E2b-Sandbox-Id": "inope", "E2b-Sandbox-Port": "49983"})
    assert "was not found" in str(_json_error(r, 502)["message"])
    r = httpx.get(f"{node.url}/x", headers={"Host": "49983-inope.localhost"})
    assert "was not found" in str(_json_error(r, 502)["message"])


def test_failed_create_leaks_nothing(node: Node, tmp_path: Path) -> None:
    """A template whose layer vanished makes the overlay mount fail half-way through create."""
    src = tmp_path / "rootfs"
    shutil.copytree(DEFAULT_CACHE / "templates" / "busybox" / "rootfs", src, symlinks=True)
    with node.client() as c:
        r = c.post("/warren/templates/import", json={"path": str(src), "name": "doomed", "runtime": "runc"})
        assert r.status_code == 201, r.text
        shutil.rmtree(r.json()["layers"][0])
        before = leaks.snapshot(state_dirs=[node.state_dir])
        _json_error(c.post("/v2/sandboxes", json={"templateID": "doomed"}), 500)
        leaks.assert_no_leaks(before)
        assert c.get("/v2/sandboxes").json() == [] or all(
            s["templateID"] != "doomed" for s in c.get("/v2/sandboxes").json()
        )


@pytest.mark.parametrize("runtime", ["gvisor"])
def test_stock_runsc_is_reported_not_used(tmp_path: Path, runtime: str) -> None:
    from tests.framework.node import running_node

    if not Path("/usr/bin/runsc").exists():
        pytest.skip("runsc is not installed")
    with running_node(tmp_path / "state", runsc=Path("/usr/bin/runsc")) as n, n.client() as c:
        probe = c.get("/health").json()["runtimes"]["gvisor"]
        if probe["available"]:
            pytest.skip("this runsc can network (a fixed release): nothing to report")
        assert "gvisor#10704" in probe["reason"]
        src = str(DEFAULT_CACHE / "templates" / "busybox" / "rootfs")
        r = c.post("/warren/templates/import", json={"path": src, "name": "g", "runtime": runtime})
        assert r.status_code == 201
        body = _json_error(c.post("/v2/sandboxes", json={"templateID": "g"}), 503)
        assert "gvisor#10704" in str(body["message"])

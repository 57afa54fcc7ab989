"""The HTTP layer in-process (ASGI) over a fake runtime: statuses, JSON errors, auth, proxy routing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote, urlencode

import httpx
import pytest

from tests.framework.fakes import FakeAgent, FakeRuntime
from warren.api import Services, create_app
from warren.api.models import parse_list_query
from warren.api.openapi import OPENAPI
from warren.api.proxy import Target, target_of
from warren.api.routes import node, runtimes, sandboxes, snapshots
from warren.config import Settings
from warren.orchestrator import SandboxManager
from warren.runtime.base import RuntimeKind
from warren.store import Database, SandboxRepo, TemplateRecord, TemplateRepo

KEY = "wrn_unit"


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    agent = FakeAgent()
    await agent.start()
    db = Database(tmp_path / "w.db")
    templates = TemplateRepo(db)
    await templates.put(TemplateRecord("t1", "base", "runc", ("/x",), {}, None, None, None, None, 2, 512, 1024, 0.0))
    runtimes = {RuntimeKind.RUNC: FakeRuntime(RuntimeKind.RUNC, agent)}
    settings = Settings(state_dir=tmp_path)
    manager = SandboxManager(settings=settings, sandboxes=SandboxRepo(db), templates=templates, runtimes=runtimes)

    async def no_import(*_: object) -> TemplateRecord:
        raise AssertionError("not used")

    svc = Services(settings, manager, templates, KEY, lambda: {"runc": {"available": True}}, no_import)
    app, proxy = create_app(svc)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://node", headers={"X-API-Key": KEY}) as c:
        c.agent_port = agent.port  # type: ignore[attr-defined]
        yield c
    await proxy.aclose()
    await agent.close()
    db.close()


async def test_create_201_and_sandbox_shape(client: httpx.AsyncClient) -> None:
    r = await client.post("/v2/sandboxes", json={"templateID": "base", "metadata": {"a": "b"}})
    assert r.status_code == 201
    body = r.json()
    assert {"templateID", "sandboxID", "clientID", "envdVersion", "envdAccessToken"} <= body.keys()
    assert body["envdVersion"] >= "0.6.4"
    info = (await client.get(f"/sandboxes/{body['sandboxID']}")).json()
    assert info["state"] == "running" and info["metadata"] == {"a": "b"}
    assert (await client.delete(f"/sandboxes/{body['sandboxID']}")).status_code == 204
    assert (await client.delete(f"/sandboxes/{body['sandboxID']}")).status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        ("post", "/v2/sandboxes", {"content": b"{bad"}, 400),
        ("post", "/v2/sandboxes", {"json": {}}, 400),
        ("post", "/v2/sandboxes", {"json": {"templateID": "zzz"}}, 404),
        ("get", "/sandboxes/nope", {}, 404),
        ("post", "/sandboxes/nope/timeout", {"json": {"timeout": 1}}, 404),
        ("get", "/no/such/route", {}, 404),
        ("put", "/v2/sandboxes", {}, 405),
    ],
)
async def test_errors_are_json(client: httpx.AsyncClient, method: str, path: str, kwargs: dict, status: int) -> None:  # type: ignore[type-arg]
    r = await client.request(method.upper(), path, **kwargs)
    assert r.status_code == status
    assert r.json()["code"] == status and r.json()["message"]


async def test_auth(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v2/sandboxes", headers={"X-API-Key": "bad"})).status_code == 401
    no_key = httpx.AsyncClient(transport=client._transport, base_url="http://node")
    assert (await no_key.get("/v2/sandboxes")).status_code == 401
    assert (await no_key.get("/health")).status_code == 200


async def test_proxy_routes_by_header_and_host(client: httpx.AsyncClient) -> None:
    sid = (await client.post("/v2/sandboxes", json={"templateID": "base"})).json()["sandboxID"]
    port = str(client.agent_port)  # type: ignore[attr-defined]
    r = await client.get("/health", headers={"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": port})
    assert r.status_code == 204
    r = await client.get("/health", headers={"Host": f"{port}-{sid}.example.test"})
    assert r.status_code == 204
    r = await client.get("/health", headers={"E2b-Sandbox-Id": "ghost"})
    assert r.status_code == 502 and "was not found" in r.json()["message"]


def test_target_parsing() -> None:
    assert target_of([(b"e2b-sandbox-id", b"abc")], None) == Target("abc", 49983)
    assert target_of([(b"host", b"3000-abc.localhost:8080")], None) == Target("abc", 3000)
    assert target_of([(b"host", b"3000-abc.other")], "mine.dev") is None
    assert target_of([(b"host", b"127.0.0.1:3000")], None) is None
    # Domain mode: the node's domain may carry its port; a client on the default port sends none.
    assert target_of([(b"host", b"8000-abc.w.localhost:8443")], "w.localhost:8443") == Target("abc", 8000)
    assert target_of([(b"host", b"8000-abc.w.localhost")], "w.localhost:8443") == Target("abc", 8000)
    assert target_of([(b"host", b"8000-abc.w.localhost:443")], "w.localhost") == Target("abc", 8000)
    assert target_of([(b"host", b"8000-abc.x.localhost:8443")], "w.localhost:8443") is None
    assert target_of([(b"host", b"api.w.localhost:8443")], "w.localhost:8443") is None


def test_metadata_query_is_double_decoded() -> None:
    raw = urlencode({quote("k y"): quote("v&w")})
    q = parse_list_query({"metadata": raw, "state": "running", "limit": "5"})
    assert q.metadata == {"k y": "v&w"} and q.states == {"running"} and q.limit == 5


def test_openapi_covers_every_route() -> None:
    documented = {(m.upper(), p.replace("{sandboxID}", "{sandbox_id}").replace("{templateID}", "{template_id}")
                   .replace("{snapshotID}", "{snapshot_id}").replace("{nodeID}", "{node_id}"))
                  for p, ops in OPENAPI["paths"].items() for m in ops}
    for route in [*sandboxes.ROUTES, *snapshots.ROUTES, *runtimes.ROUTES, *node.ROUTES]:
        for method in route.methods or ():
            if method != "HEAD":
                assert (method, route.path) in documented

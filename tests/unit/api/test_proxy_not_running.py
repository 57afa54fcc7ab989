"""What the proxy answers for a sandbox that does not run: E2B's 502, whose message the SDK reads
("was not found": ``SandboxNotRunningException``; ``is_running()`` is False for any 502), saying
whether it is paused or was killed. A paused sandbox that auto-resumes is woken instead."""

from __future__ import annotations

import httpx
from starlette.types import Receive, Scope, Send

from warren.api.proxy import SandboxProxy
from warren.orchestrator.states import SandboxState

_ROUTES = {
    "ipaused": ("10.0.0.1", SandboxState.PAUSED),
    "ipausing": ("10.0.0.2", SandboxState.PAUSING),
}


async def _control_plane(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("sandbox traffic must not reach the control plane")


async def _no_wake(sandbox_id: str) -> str | None:
    return None  # no auto-resume


async def _get(proxy: SandboxProxy, sandbox_id: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=proxy)
    async with httpx.AsyncClient(transport=transport, base_url="http://node") as client:
        return await client.get("/health", headers={"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"})


async def test_paused_killed_and_unknown_answer_502_saying_which() -> None:
    proxy = SandboxProxy(_control_plane, _ROUTES.get, None, wake=_no_wake, ended=lambda i: i == "ikilled")
    try:
        for sandbox_id, word in (("ipaused", "paused"), ("ipausing", "paused"), ("ikilled", "killed")):
            r = await _get(proxy, sandbox_id)
            assert r.status_code == 502, r.text
            body = r.json()
            assert body["code"] == 502 and body["sandboxId"] == sandbox_id
            assert "was not found" in body["message"] and word in body["message"]
        unknown = (await _get(proxy, "inope")).json()
        assert unknown["message"] == "The sandbox inope was not found"
    finally:
        await proxy.aclose()


async def test_a_paused_sandbox_that_auto_resumes_is_woken() -> None:
    woken: list[str] = []

    async def wake(sandbox_id: str) -> str | None:
        woken.append(sandbox_id)
        return "127.0.0.1"  # nothing listens on its port 49983 here: the answer is "port is not open"

    proxy = SandboxProxy(_control_plane, _ROUTES.get, None, wake=wake)
    try:
        r = await _get(proxy, "ipaused")
    finally:
        await proxy.aclose()
    assert woken == ["ipaused"]
    assert r.status_code == 502 and "port 49983 is not open" in r.json()["message"]

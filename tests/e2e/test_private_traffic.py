"""Private traffic (``network.allowPublicTraffic: false``): the create and connect answers carry a
``trafficAccessToken``, and the proxy lets traffic reach a sandbox port other than envd's only with
the ``e2b-traffic-access-token`` header holding it (E2B's 403 JSON otherwise). Refused traffic never
auto-resumes a paused sandbox. The SDK's own envd traffic keeps using the envd access token."""

from __future__ import annotations

import time

import httpx
from e2b import AsyncSandbox, Sandbox

from tests.framework.node import Node

PORT = 8000
HEADER = "e2b-traffic-access-token"
WAIT = """
import socket, sys, time
deadline = time.monotonic() + 30
while True:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
"""


def _serve(box: Sandbox) -> None:
    box.files.write("/tmp/wait.py", WAIT)
    box.files.write("/tmp/www/hello.txt", "hello from the sandbox")
    box.commands.run(f"cd /tmp/www && python3 -m http.server {PORT}", background=True)
    assert box.commands.run(f"python3 /tmp/wait.py {PORT}", timeout=60).exit_code == 0


def _get(node: Node, sandbox_id: str, token: str | None = None) -> httpx.Response:
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(PORT)}
    if token is not None:
        headers[HEADER] = token
    return httpx.get(f"{node.url}/hello.txt", headers=headers, timeout=60)


def test_private_sandbox_needs_its_token(node: Node, template: str) -> None:
    box = Sandbox.create(template=template, timeout=120, network={"allow_public_traffic": False})
    other = Sandbox.create(template=template, timeout=120, network={"allow_public_traffic": False})
    try:
        token = box.traffic_access_token
        assert token and other.traffic_access_token and token != other.traffic_access_token
        _serve(box)  # envd traffic (commands, files) needs no traffic token
        missing = _get(node, box.sandbox_id)
        assert missing.status_code == 403
        assert missing.json() == {
            "sandboxId": box.sandbox_id,
            "code": 403,
            "message": f"Sandbox is secured with traffic access token. Token header '{HEADER}' is missing",
        }
        for wrong in ("nope", str(other.traffic_access_token), token + "x"):
            refused = _get(node, box.sandbox_id, wrong)
            assert refused.status_code == 403
            assert refused.json()["message"] == (
                f"Sandbox is secured with traffic access token. Provided token in header '{HEADER}' is invalid"
            )
        ok = _get(node, box.sandbox_id, token)
        assert ok.status_code == 200 and ok.text == "hello from the sandbox"
        assert Sandbox.connect(box.sandbox_id).traffic_access_token == token
    finally:
        box.kill()
        other.kill()


def test_public_sandbox_has_no_token(node: Node, template: str) -> None:
    box = Sandbox.create(template=template, timeout=120)
    try:
        assert box.traffic_access_token is None
        _serve(box)
        assert _get(node, box.sandbox_id).status_code == 200
    finally:
        box.kill()


def test_refused_traffic_does_not_resume_a_paused_sandbox(node: Node, template: str) -> None:
    box = Sandbox.create(
        template=template,
        timeout=120,
        network={"allow_public_traffic": False},
        lifecycle={"on_timeout": "pause", "auto_resume": True},
    )
    try:
        _serve(box)
        token = box.traffic_access_token
        assert token
        box.pause()
        for wrong in (None, "wrong"):
            refused = _get(node, box.sandbox_id, wrong)
            assert refused.status_code == 403, refused.text
            assert refused.json()["sandboxId"] == box.sandbox_id
        time.sleep(0.5)
        assert box.get_info().state.value == "paused"
        ok = _get(node, box.sandbox_id, token)  # the right token auto-resumes it
        assert ok.status_code == 200 and ok.text == "hello from the sandbox"
        assert box.get_info().state.value == "running"
    finally:
        box.kill()


def test_fork_of_a_private_sandbox_is_private_with_its_own_token(node: Node, template: str) -> None:
    box = Sandbox.create(template=template, timeout=120, network={"allow_public_traffic": False})
    try:
        children = box.fork(count=1)
        child = children[0]
        assert isinstance(child, Sandbox), children
        try:
            assert child.traffic_access_token and child.traffic_access_token != box.traffic_access_token
            _serve(child)
            assert _get(node, child.sandbox_id).status_code == 403
            assert _get(node, child.sandbox_id, box.traffic_access_token).status_code == 403
            assert _get(node, child.sandbox_id, child.traffic_access_token).status_code == 200
        finally:
            child.kill()
    finally:
        box.kill()


async def test_async_private_sandbox(node: Node, template: str) -> None:
    box = await AsyncSandbox.create(template=template, timeout=120, network={"allow_public_traffic": False})
    try:
        token = box.traffic_access_token
        assert token
        await box.files.write("/tmp/www/hello.txt", "hello from the sandbox")
        await box.files.write("/tmp/wait.py", WAIT)
        await box.commands.run(f"cd /tmp/www && python3 -m http.server {PORT}", background=True)
        assert (await box.commands.run(f"python3 /tmp/wait.py {PORT}", timeout=60)).exit_code == 0
        headers = {"E2b-Sandbox-Id": box.sandbox_id, "E2b-Sandbox-Port": str(PORT)}
        async with httpx.AsyncClient(base_url=node.url, headers=headers, timeout=60) as client:
            assert (await client.get("/hello.txt")).status_code == 403
            assert (await client.get("/hello.txt", headers={HEADER: "bad"})).status_code == 403
            assert (await client.get("/hello.txt", headers={HEADER: token})).status_code == 200
        assert (await AsyncSandbox.connect(box.sandbox_id)).traffic_access_token == token
    finally:
        await box.kill()

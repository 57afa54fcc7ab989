"""Domain mode: a node started with ``--domain warren.localhost:<port>`` serves HTTPS with its own CA,
and the unmodified SDK, given only ``E2B_API_URL`` and ``E2B_DOMAIN`` (no ``E2B_SANDBOX_URL``), reaches
every sandbox at ``https://<port>-<id>.warren.localhost:<port>``: envd (commands, files), ``get_host``
(an HTTP server and a WebSocket echo in the sandbox), and signed ``download_url``/``upload_url``
used with no API key and no header, as a browser would.

Name resolution: the SDK's HTTP stack (pyqwest) resolves every ``*.localhost`` name to loopback
(RFC 6761). Python's own resolver on this host (glibc) does not, so the ``loopback_localhost``
fixture patches ``socket.getaddrinfo`` in this test process for ``*.localhost`` names only: it
stands in for the wildcard DNS record an operator sets up, and is used only by this file's own
httpx and websockets clients, never by the SDK.

The rest of the SDK suites run in domain mode with ``WARREN_E2E_DOMAIN=1`` (see ``conftest.py``).
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox
from websockets.sync.client import connect

from tests.e2e.conftest import e2e_node
from tests.e2e.test_proxy_websocket import ECHO_SERVER, WAIT_FOR_PORT, WS_PORT
from tests.framework.node import Node

HTTP_PORT = 8000
EXPIRED = "signature is already expired"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, patched_runsc: Path, node_ca: Path) -> Iterator[Node]:
    """This module's node: in domain mode (overrides the session's header-mode node)."""
    with e2e_node(tmp_path_factory, patched_runsc, node_ca) as n:
        yield n


def _trust(node: Node) -> ssl.SSLContext:
    verify = node.verify()
    assert isinstance(verify, ssl.SSLContext)
    return verify


def _serve_http(box: Sandbox) -> None:
    box.files.write("/tmp/www/hello.txt", "hello over https")
    box.files.write("/tmp/wait.py", WAIT_FOR_PORT.replace(str(WS_PORT), str(HTTP_PORT)))
    box.commands.run(f"cd /tmp/www && python3 -m http.server {HTTP_PORT}", background=True)
    assert box.commands.run("python3 /tmp/wait.py", timeout=60).exit_code == 0


def test_the_sdk_reaches_sandboxes_by_domain_only(node: Node, sbx: Sandbox) -> None:
    assert "E2B_SANDBOX_URL" not in os.environ and os.environ["E2B_DOMAIN"] == node.domain
    assert sbx.sandbox_domain == node.domain
    assert sbx.commands.run("echo $((6 * 7))").stdout.strip() == "42"
    sbx.files.write("/home/user/d.txt", "by domain")
    assert sbx.files.read("/home/user/d.txt") == "by domain"
    assert Sandbox.connect(sbx.sandbox_id).commands.run("cat /home/user/d.txt").stdout == "by domain"
    with node.client() as c:
        health = c.get("/health").json()
    assert health["domain"] == node.domain and health["tlsCA"].endswith("/tls/ca.pem")
    assert health["sandboxUrls"] == f"https://<port>-<sandboxID>.{node.domain}"


def test_get_host_serves_http(node: Node, sbx: Sandbox, loopback_localhost: None) -> None:
    _serve_http(sbx)
    host = sbx.get_host(HTTP_PORT)
    assert host == f"{HTTP_PORT}-{sbx.sandbox_id}.{node.domain}"
    r = httpx.get(f"https://{host}/hello.txt", verify=_trust(node), timeout=60)
    assert r.status_code == 200 and r.text == "hello over https"
    closed = httpx.get(f"https://{HTTP_PORT + 1}-{sbx.sandbox_id}.{node.domain}/", verify=_trust(node), timeout=60)
    assert closed.status_code == 502 and "is not open" in closed.json()["message"]


def test_get_host_serves_a_websocket(node: Node, sbx: Sandbox, loopback_localhost: None) -> None:
    sbx.files.write("/tmp/ws_echo.py", ECHO_SERVER)
    sbx.files.write("/tmp/wait.py", WAIT_FOR_PORT)
    sbx.commands.run("python3 /tmp/ws_echo.py", background=True)
    assert sbx.commands.run("python3 /tmp/wait.py", timeout=60).exit_code == 0
    with connect(f"wss://{sbx.get_host(WS_PORT)}/echo", ssl=_trust(node), open_timeout=10) as ws:
        for text in ("hello", "über domain"):
            ws.send(text)
            assert ws.recv(timeout=10) == text


def test_signed_urls_need_no_key(node: Node, sbx: Sandbox, loopback_localhost: None) -> None:
    sbx.files.write("/home/user/signed.txt", "signed content")
    with httpx.Client(verify=_trust(node), timeout=60) as browser:  # no API key, no envd token
        for url in (sbx.download_url("/home/user/signed.txt"),
                    sbx.download_url("/home/user/signed.txt", use_signature_expiration=120)):  # fmt: skip
            assert "signature=" in url
            r = browser.get(url)
            assert r.status_code == 200 and r.text == "signed content"
        for name, expiration in (("up1.txt", None), ("up2.txt", 120)):
            url = sbx.upload_url(f"/home/user/{name}", use_signature_expiration=expiration)
            r = browser.post(url, files={"file": (name, b"uploaded " + name.encode())})
            assert r.status_code == 200, r.text
            assert sbx.files.read(f"/home/user/{name}") == f"uploaded {name}"
        forged = sbx.download_url("/home/user/signed.txt").replace("signed.txt", "other.txt")
        assert browser.get(forged).status_code == 401
        expired = sbx.download_url("/home/user/signed.txt", use_signature_expiration=-5)
        r = browser.get(expired)
        assert r.status_code == 401 and r.json()["message"] == EXPIRED
        expired_upload = sbx.upload_url("/home/user/late.txt", use_signature_expiration=-5)
        r = browser.post(expired_upload, files={"file": ("late.txt", b"late")})
        assert r.status_code == 401 and r.json()["message"] == EXPIRED
        assert not sbx.files.exists("/home/user/late.txt")


def test_private_traffic_by_domain(node: Node, template: str, loopback_localhost: None) -> None:
    box = Sandbox.create(template=template, timeout=120, network={"allow_public_traffic": False})
    try:
        _serve_http(box)
        url = f"https://{box.get_host(HTTP_PORT)}/hello.txt"
        with httpx.Client(verify=_trust(node), timeout=60) as client:
            assert client.get(url).status_code == 403
            assert client.get(url, headers={"e2b-traffic-access-token": "wrong"}).status_code == 403
            token = str(box.traffic_access_token)
            ok = client.get(url, headers={"e2b-traffic-access-token": token})
            assert ok.status_code == 200 and ok.text == "hello over https"
    finally:
        box.kill()


def test_auto_resume_by_domain(node: Node, template: str, loopback_localhost: None) -> None:
    box = Sandbox.create(template=template, timeout=120, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        _serve_http(box)
        box.pause()
        assert box.get_info().state.value == "paused"
        r = httpx.get(f"https://{box.get_host(HTTP_PORT)}/hello.txt", verify=_trust(node), timeout=120)
        assert r.status_code == 200 and r.text == "hello over https"  # the request woke it
        assert box.get_info().state.value == "running"
    finally:
        box.kill()


async def test_async_sdk_by_domain(node: Node, template: str, loopback_localhost: None) -> None:
    box = await AsyncSandbox.create(template=template, timeout=120)
    try:
        assert box.sandbox_domain == node.domain
        assert (await box.commands.run("echo async")).stdout.strip() == "async"
        await box.files.write("/home/user/a.txt", "async file")
        assert await box.files.read("/home/user/a.txt") == "async file"
        handle = await box.commands.run("sleep 30", background=True)
        assert await box.commands.kill(handle.pid)
        # Python's sync resolver is the patched one (the event loop's may be uvloop's, which is not).
        with httpx.Client(verify=_trust(node), timeout=60) as browser:
            url = box.download_url("/home/user/a.txt", use_signature_expiration=60)
            r = await asyncio.to_thread(browser.get, url)
            assert r.status_code == 200 and r.text == "async file"
            url = box.download_url("/home/user/a.txt", use_signature_expiration=-5)
            r = await asyncio.to_thread(browser.get, url)
            assert r.status_code == 401 and r.json()["message"] == EXPIRED
        await box.pause()
        resumed = await AsyncSandbox.connect(box.sandbox_id)
        assert await resumed.files.read("/home/user/a.txt") == "async file"
    finally:
        await box.kill()

"""``POST /init``, sandbox env vars, defaults, the access token and signed ``/files`` URLs."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from e2b import AuthenticationException

from .conftest import AgentProc
from .helpers import STREAM, envelope, make_sandbox, unary

TOKEN = "tok-secret-123"


def _init(agent: AgentProc, body: dict[str, object], token: str | None = None) -> httpx.Response:
    headers = {"X-Access-Token": token} if token else {}
    with agent.client() as c:
        return c.post("/init", json=body, headers=headers)


def test_init_env_vars_apply_to_processes_and_envs(fresh_agent: Callable[..., AgentProc]) -> None:
    agent = fresh_agent()
    r = _init(
        agent, {"envVars": {"SANDBOX_VAR": "from-init", "OVERRIDE": "sandbox"}, "timestamp": "2026-01-01T00:00:00Z"}
    )
    assert r.status_code == 204
    with agent.client() as c:
        assert c.get("/envs").json() == {"SANDBOX_VAR": "from-init", "OVERRIDE": "sandbox"}
    sbx = make_sandbox(agent.url)
    assert sbx.commands.run("echo $SANDBOX_VAR").stdout == "from-init\n"
    assert sbx.commands.run("echo $OVERRIDE", envs={"OVERRIDE": "request"}).stdout == "request\n"
    assert _init(agent, {"envVars": {"SECOND": "2"}}).status_code == 204  # merged, not replaced
    with agent.client() as c:
        assert c.get("/envs").json()["SANDBOX_VAR"] == "from-init"


def test_init_default_user_and_workdir(fresh_agent: Callable[..., AgentProc]) -> None:
    agent = fresh_agent()
    work = agent.root / "work"
    work.mkdir()
    (work / "marker").write_text("m")
    assert _init(agent, {"defaultUser": "root", "defaultWorkdir": str(work)}).status_code == 204
    sbx = make_sandbox(agent.url)
    assert sbx.commands.run("id -u; pwd").stdout.split() == ["0", str(work)]
    info = sbx.files.write("relative.txt", "x")
    assert info.path == "/root/relative.txt"  # relative paths resolve against the (root) user's home
    sbx.files.remove(info.path)
    assert [e.name for e in sbx.files.list("")] == ["marker"]  # an empty path is the default workdir


def test_unknown_default_user_is_unauthenticated(fresh_agent: Callable[..., AgentProc]) -> None:
    agent = fresh_agent()
    assert _init(agent, {"defaultUser": "ghost"}).status_code == 204
    with agent.client() as c:
        r = unary(c, "filesystem.Filesystem/Stat", {"path": "/"})
        assert (r.status_code, r.json()["code"]) == (401, "unauthenticated")
        assert c.get("/files", params={"path": "/etc/hostname"}).status_code == 401
    with pytest.raises(AuthenticationException):
        make_sandbox(agent.url).commands.run("true")


def test_access_token_is_enforced(fresh_agent: Callable[..., AgentProc]) -> None:
    agent = fresh_agent()
    assert _init(agent, {"accessToken": TOKEN}).status_code == 204
    with agent.client() as c:
        assert c.get("/health").status_code == 204  # never needs the token
        r = unary(c, "filesystem.Filesystem/Stat", {"path": "/"})
        assert (r.status_code, r.json()["code"]) == (401, "unauthenticated")
        r = c.post(
            "/process.Process/Start",
            content=envelope({"process": {"cmd": "true"}}),
            headers={"content-type": STREAM},
        )
        assert r.status_code == 401  # before any stream starts: a plain Connect error
        assert c.get("/envs").status_code == 401
        assert c.get("/metrics").status_code == 401
        assert c.get("/files", params={"path": "/etc/hostname"}).status_code == 401
        assert unary(c, "filesystem.Filesystem/Stat", {"path": "/"}, **{"X-Access-Token": "wrong"}).status_code == 401
        ok = unary(c, "filesystem.Filesystem/Stat", {"path": "/"}, **{"X-Access-Token": TOKEN})
        assert ok.status_code == 200
        assert c.get("/envs", headers={"X-Access-Token": TOKEN}).status_code == 200
    with pytest.raises(AuthenticationException):
        make_sandbox(agent.url).commands.run("true")
    with pytest.raises(AuthenticationException):
        make_sandbox(agent.url, "wrong-token").files.read("/etc/hostname")
    sbx = make_sandbox(agent.url, TOKEN)
    assert sbx.commands.run("echo authed").stdout == "authed\n"
    sbx.files.write("t.txt", "secured")
    assert sbx.files.read("t.txt") == "secured"


def test_init_needs_the_current_token_and_can_rotate_it(fresh_agent: Callable[..., AgentProc]) -> None:
    agent = fresh_agent()
    assert _init(agent, {"accessToken": TOKEN}).status_code == 204
    assert _init(agent, {"accessToken": "other"}).status_code == 401
    assert _init(agent, {"envVars": {"A": "1"}}, token="wrong").status_code == 401
    assert _init(agent, {"accessToken": "rotated"}, token=TOKEN).status_code == 204
    with agent.client() as c:
        assert c.get("/envs", headers={"X-Access-Token": TOKEN}).status_code == 401
        assert c.get("/envs", headers={"X-Access-Token": "rotated"}).status_code == 200


def test_signed_file_urls(fresh_agent: Callable[..., AgentProc]) -> None:
    agent = fresh_agent()
    assert _init(agent, {"accessToken": TOKEN}).status_code == 204
    sbx = make_sandbox(agent.url, TOKEN)
    with httpx.Client(timeout=30) as c:  # no X-Access-Token: the signature alone authorizes
        up = sbx.upload_url("signed/up.txt")
        r = c.post(up, files={"file": ("signed/up.txt", b"via signed url")})
        assert r.status_code == 200, r.text
        assert c.get(sbx.download_url("signed/up.txt")).content == b"via signed url"
        root_url = sbx.download_url(str(agent.home / "signed/up.txt"), user="root", use_signature_expiration=60)
        assert c.get(root_url).content == b"via signed url"
        # a signature for reading does not allow writing, nor another path or user
        assert c.post(sbx.download_url("signed/up.txt"), content=b"x").status_code == 401
        assert c.get(sbx.download_url("signed/up.txt").replace("up.txt", "other.txt")).status_code == 401
        tampered = sbx.download_url("signed/up.txt") + "&username=root"
        assert c.get(tampered).status_code == 401
        expired = sbx.download_url("signed/up.txt", use_signature_expiration=-10)
        assert c.get(expired).status_code == 401
        assert "expired" in c.get(expired).json()["message"]
        # a wrong token in the header is refused even with a valid signature
        wrong = c.get(sbx.download_url("signed/up.txt"), headers={"X-Access-Token": "nope"})
        assert wrong.status_code == 401
    assert int(time.time()) > 0


def test_bad_init_bodies(fresh_agent: Callable[..., AgentProc]) -> None:
    agent = fresh_agent()
    with agent.client() as c:
        assert c.post("/init", content=b"{bad").status_code == 400
        assert c.post("/init", json={"envVars": {"A": 1}}).status_code == 400
        assert c.post("/init", content=b"").status_code == 204
        assert c.get("/init").status_code == 405


def test_refused_big_upload_still_gets_its_401(fresh_agent: Callable[..., AgentProc]) -> None:
    agent = fresh_agent()
    assert _init(agent, {"accessToken": TOKEN}).status_code == 204
    with agent.client() as c:
        for _ in range(3):
            r = c.post(
                "/files",
                params={"path": "big.bin"},
                content=b"z" * (8 << 20),
                headers={"content-type": "application/octet-stream", "X-Access-Token": "wrong"},
            )
            assert r.status_code == 401
        ok = c.post(
            "/files",
            params={"path": "small.bin"},
            content=b"z",
            headers={"content-type": "application/octet-stream", "X-Access-Token": TOKEN},
        )
        assert ok.status_code == 200

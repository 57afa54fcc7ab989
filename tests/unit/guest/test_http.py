"""The agent's HTTP/1.1 layer and plain routes, driven over raw sockets and httpx."""

from __future__ import annotations

import json
import socket

import httpx

from .conftest import AgentProc


def _raw(agent: AgentProc, data: bytes, *, read_until_close: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as s:
        s.sendall(data)
        if not read_until_close:
            return s.recv(65536)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_health_is_204_without_auth(agent: AgentProc) -> None:
    with agent.client() as c:
        r = c.get("/health")
    assert r.status_code == 204
    assert r.content == b""


def test_health_answer_fits_one_read_and_connection_close_is_honoured(agent: AgentProc) -> None:
    out = _raw(agent, b"GET /health HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 204 ")
    assert b"Connection: close" in out


def test_keep_alive_serves_several_requests_on_one_connection(agent: AgentProc) -> None:
    req = b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n"
    last = b"GET /health HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    out = _raw(agent, req + req + last)  # pipelined
    assert out.count(b"HTTP/1.1 204 ") == 3


def test_double_leading_slash_is_tolerated(agent: AgentProc) -> None:
    # httpx normalises "//x" away, so this goes over a raw socket, as the SDK's trailing-slash URL does.
    out = _raw(agent, b"GET //health HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 204 ")
    body = json.dumps({"path": "/"}).encode()
    out = _raw(
        agent,
        b"POST //filesystem.Filesystem/Stat HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
    )
    head, _, payload = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert json.loads(payload)["entry"]["type"] == "FILE_TYPE_DIRECTORY"


def test_chunked_request_body(agent: AgentProc) -> None:
    body = json.dumps({"path": "/"}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + 3]), body[i : i + 3]) for i in range(0, len(body), 3))
    req = (
        b"POST /filesystem.Filesystem/Stat HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked + b"0\r\n\r\n"
    )
    out = _raw(agent, req)
    head, _, payload = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert json.loads(payload)["entry"]["path"] == "/"


def test_expect_100_continue(agent: AgentProc) -> None:
    body = json.dumps({"path": "/"}).encode()
    with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as s:
        s.sendall(
            b"POST /filesystem.Filesystem/Stat HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        assert s.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    assert out.startswith(b"HTTP/1.1 200 ")


def test_malformed_request_gets_400(agent: AgentProc) -> None:
    out = _raw(agent, b"NONSENSE\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400 ")


def test_unknown_route_is_404_json(agent: AgentProc) -> None:
    with agent.client() as c:
        r = c.get("/nope")
    assert r.status_code == 404
    assert r.json()["code"] == 404 and "message" in r.json()


def test_envs_and_metrics(agent: AgentProc) -> None:
    with agent.client() as c:
        envs = c.get("/envs")
        metrics = c.get("/metrics")
    assert envs.status_code == 200 and isinstance(envs.json(), dict)
    m = metrics.json()
    for key in ("ts", "cpu_count", "cpu_used_pct", "mem_total", "mem_used", "mem_cache", "disk_used", "disk_total"):
        assert key in m, key
    assert m["cpu_count"] >= 1 and m["mem_total"] > 0 and m["disk_total"] >= m["disk_used"] > 0


def test_many_concurrent_connections(agent: AgentProc) -> None:
    limits = httpx.Limits(max_connections=50)
    with agent.client(limits=limits) as c:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(lambda _: c.get("/health").status_code, range(100)))
    assert codes == [204] * 100

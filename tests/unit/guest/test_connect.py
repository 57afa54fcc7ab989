"""The Connect protocol details, with raw httpx: envelopes, end-stream, error mapping, codecs."""

from __future__ import annotations

import base64
import socket
import struct

from .conftest import USER_UID, AgentProc
from .helpers import STREAM, envelope, parse_envelopes, stream_call, unary


def test_unary_success_and_camel_case_output(agent: AgentProc) -> None:
    (agent.home / "f.txt").write_text("hello")
    with agent.client() as c:
        r = unary(c, "filesystem.Filesystem/Stat", {"path": "f.txt"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    entry = r.json()["entry"]
    assert entry["name"] == "f.txt"
    assert entry["type"] == "FILE_TYPE_FILE"
    assert entry["path"] == str(agent.home / "f.txt")
    assert entry["size"] == "5"  # int64 as a string
    assert entry["permissions"].startswith("-")
    assert "modifiedTime" in entry and entry["modifiedTime"].endswith("Z")


def test_unary_error_is_connect_json_with_http_mapping(agent: AgentProc) -> None:
    with agent.client() as c:
        r = unary(c, "filesystem.Filesystem/Stat", {"path": "/definitely/not/here"})
        assert r.status_code == 404
        assert r.json()["code"] == "not_found" and r.json()["message"]
        (agent.home / "exists").mkdir(exist_ok=True)
        r = unary(c, "filesystem.Filesystem/MakeDir", {"path": "exists"})
        assert (r.status_code, r.json()["code"]) == (409, "already_exists")
        r = unary(c, "filesystem.Filesystem/ListDir", {"path": "f-missing", "depth": 1})
        assert r.json()["code"] == "not_found"
        r = unary(c, "process.Process/SendSignal", {"process": {"pid": 999999}, "signal": "SIGNAL_SIGKILL"})
        assert (r.status_code, r.json()["code"]) == (404, "not_found")


def test_unary_accepts_snake_case_input(agent: AgentProc) -> None:
    with agent.client() as c:
        r = unary(c, "filesystem.Filesystem/CreateWatcher", {"path": str(agent.home)})
        watcher_id = r.json()["watcherId"]
        assert unary(c, "filesystem.Filesystem/GetWatcherEvents", {"watcher_id": watcher_id}).status_code == 200
        assert unary(c, "filesystem.Filesystem/RemoveWatcher", {"watcher_id": watcher_id}).json() == {}
        r = unary(c, "filesystem.Filesystem/RemoveWatcher", {"watcherId": watcher_id})
        assert r.json()["code"] == "not_found"


def test_bad_json_and_wrong_content_type(agent: AgentProc) -> None:
    with agent.client() as c:
        r = c.post("/filesystem.Filesystem/Stat", content=b"{nope", headers={"content-type": "application/json"})
        assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
        r = c.post("/filesystem.Filesystem/Stat", content=b"\x00", headers={"content-type": "application/proto"})
        assert r.status_code == 415
        r = c.get("/filesystem.Filesystem/Stat")
        assert r.status_code == 405
        r = unary(c, "filesystem.Filesystem/Nope", {})
        assert r.json()["code"] == "unimplemented"


def test_server_stream_envelopes_and_end_stream(agent: AgentProc) -> None:
    msg = {"process": {"cmd": "/bin/sh", "args": ["-c", "printf out; printf err >&2"]}}
    with agent.client() as c:
        r, frames = stream_call(c, "process.Process/Start", msg)
    assert r.status_code == 200
    assert r.headers["content-type"] == STREAM
    assert all(flags == 0 for flags, _ in frames[:-1])
    assert frames[-1] == (2, {})
    events = [m["event"] for _, m in frames[:-1]]
    assert list(events[0]) == ["start"] and events[0]["start"]["pid"] > 0
    assert events[-1]["end"] == {"status": "exit status 0", "exited": True}  # exitCode 0 omitted
    stdout = b"".join(base64.b64decode(e["data"]["stdout"]) for e in events if "stdout" in e.get("data", {}))
    stderr = b"".join(base64.b64decode(e["data"]["stderr"]) for e in events if "stderr" in e.get("data", {}))
    assert (stdout, stderr) == (b"out", b"err")


def test_server_stream_error_goes_in_end_stream(agent: AgentProc) -> None:
    with agent.client() as c:
        r, frames = stream_call(c, "process.Process/Connect", {"process": {"pid": 999999}})
        assert r.status_code == 200
        assert frames == [(2, {"error": {"code": "not_found", "message": "process with pid 999999 not found"}})]
        r, frames = stream_call(c, "process.Process/Start", {"process": {"cmd": "/no/such/binary"}})
        assert frames[-1][0] == 2 and frames[-1][1]["error"]["code"] == "invalid_argument"
        r, frames = stream_call(c, "process.Process/Start", {"process": {"cmd": "true", "cwd": "/no/dir"}})
        assert frames[-1][1]["error"]["code"] == "invalid_argument"


def test_client_stream_stream_input(agent: AgentProc) -> None:
    with agent.client() as c:
        start = {"process": {"cmd": "/bin/cat"}, "stdin": True}
        with c.stream(
            "POST",
            "/process.Process/Start",
            content=envelope(start),
            headers={"content-type": STREAM},
        ) as events:
            chunks = events.iter_bytes()
            buf = b""
            while len(buf) < 5 or len(buf) < 5 + struct.unpack_from(">I", buf, 1)[0]:
                buf += next(chunks)
            pid = parse_envelopes(buf[: 5 + struct.unpack_from(">I", buf, 1)[0]])[0][1]["event"]["start"]["pid"]
            body = b"".join(
                [
                    envelope({"start": {"process": {"pid": pid}}}),
                    envelope({"data": {"input": {"stdin": base64.b64encode(b"abc").decode()}}}),
                    envelope({"keepalive": {}}),
                    envelope({"data": {"input": {"stdin": base64.b64encode(b"def").decode()}}}),
                ]
            )

            def gen():  # type: ignore[no-untyped-def]
                for i in range(0, len(body), 7):  # chunked request body, envelopes split across chunks
                    yield body[i : i + 7]

            with agent.client() as c2:
                r = c2.post("/process.Process/StreamInput", content=gen(), headers={"content-type": STREAM})
                assert r.status_code == 200
                assert parse_envelopes(r.content) == [(0, {}), (2, {})]
                assert unary(c2, "process.Process/CloseStdin", {"process": {"pid": pid}}).json() == {}
            rest = buf + b"".join(chunks)
    frames = parse_envelopes(rest)
    out = b"".join(base64.b64decode(m["event"]["data"]["stdout"]) for _, m in frames if "data" in m.get("event", {}))
    assert out == b"abcdef"
    assert frames[-2][1]["event"]["end"]["exited"] is True


def test_keepalive_events_are_sent(agent: AgentProc) -> None:
    msg = {"process": {"cmd": "/bin/sh", "args": ["-c", "sleep 2.5"]}}
    with agent.client() as c:
        _, frames = stream_call(c, "process.Process/Start", msg, headers={"Keepalive-Ping-Interval": "1"})
    kinds = [next(iter(m["event"])) for _, m in frames[:-1]]
    assert kinds[0] == "start" and kinds[-1] == "end"
    assert "keepalive" in kinds


def test_basic_auth_picks_the_user(agent: AgentProc) -> None:
    msg = {"process": {"cmd": "/usr/bin/id", "args": ["-u"]}}

    def uid(headers: dict[str, str]) -> str:
        with agent.client() as c:
            _, frames = stream_call(c, "process.Process/Start", msg, headers=headers)
        data = [m["event"]["data"]["stdout"] for _, m in frames if "data" in m.get("event", {})]
        return base64.b64decode("".join(data)).decode().strip()

    assert uid({}) == str(USER_UID)  # default user: "user" exists in passwd
    assert uid({"Authorization": "Basic " + base64.b64encode(b"root:").decode()}) == "0"
    assert uid({"Authorization": "Basic " + base64.b64encode(b"user:").decode()}) == str(USER_UID)
    with agent.client() as c:
        bad = {"Authorization": "Basic " + base64.b64encode(b"ghost:").decode()}
        r = unary(c, "filesystem.Filesystem/Stat", {"path": "/"}, **bad)
        assert (r.status_code, r.json()["code"]) == (401, "unauthenticated")
        _, frames = stream_call(c, "process.Process/Start", msg, headers=bad)
        assert frames[-1][1]["error"]["code"] == "unauthenticated"


def test_stream_survives_client_disconnect_and_process_keeps_running(agent: AgentProc) -> None:
    msg = {"process": {"cmd": "/bin/sh", "args": ["-c", "sleep 30"]}, "tag": "disconnect-test"}
    with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as s:
        body = envelope(msg)
        s.sendall(
            b"POST /process.Process/Start HTTP/1.1\r\nHost: a\r\nContent-Type: application/connect+json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        got = b""
        while b'"start"' not in got:
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
    with agent.client() as c:
        procs = unary(c, "process.Process/List", {}).json()["processes"]
        mine = [p for p in procs if p.get("tag") == "disconnect-test"]
        assert len(mine) == 1 and mine[0]["config"]["cmd"] == "/bin/sh"
        # reconnect by tag, then kill it
        r = unary(c, "process.Process/SendSignal", {"process": {"tag": "disconnect-test"}, "signal": "SIGNAL_SIGTERM"})
        assert r.json() == {}

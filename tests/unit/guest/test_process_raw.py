"""Process details seen on the wire: timeouts, PTY events, OOM score, signals, agent lifecycle."""

from __future__ import annotations

import base64
import os
import signal
from collections.abc import Callable
from typing import Any

from .conftest import AgentProc
from .helpers import stream_call, unary

ROOT = {"Authorization": "Basic " + base64.b64encode(b"root:").decode()}


def _output(frames: list[tuple[int, dict[str, Any]]], kind: str = "stdout") -> bytes:
    return b"".join(
        base64.b64decode(m["event"]["data"][kind]) for _, m in frames if kind in m.get("event", {}).get("data", {})
    )


def test_timeout_kills_the_process_and_ends_the_stream(agent: AgentProc) -> None:
    msg = {"process": {"cmd": "/bin/sh", "args": ["-c", "echo started; sleep 60"]}}
    with agent.client() as c:
        _, frames = stream_call(c, "process.Process/Start", msg, headers={"Connect-Timeout-Ms": "700"})
        pid = frames[0][1]["event"]["start"]["pid"]
        assert _output(frames) == b"started\n"
        end = frames[-2][1]["event"]["end"]
        assert end == {"status": "signal: killed", "exitCode": -1, "error": "signal: killed"}
        assert frames[-1][0] == 2 and frames[-1][1]["error"]["code"] == "deadline_exceeded"
        assert all(p["pid"] != pid for p in unary(c, "process.Process/List", {}).json().get("processes", []))


def test_kill_reaches_the_whole_process_group(agent: AgentProc) -> None:
    # The shell forks a child that keeps stdout open; killing must still end the stream.
    msg = {"process": {"cmd": "/bin/sh", "args": ["-c", "sleep 60 & sleep 60; wait"]}}
    with agent.client() as c:
        with c.stream("POST", "/process.Process/Start", content=_env(msg), headers=_stream_headers()) as r:
            it = r.iter_bytes()
            first = next(it)
            pid = int(first.split(b'"pid":')[1].split(b"}")[0])
            assert unary(c, "process.Process/SendSignal", {"process": {"pid": pid}, "signal": 9}).json() == {}
            rest = first + b"".join(it)
    assert b'"signal: killed"' in rest


def test_pty_events_and_exit(agent: AgentProc) -> None:
    msg = {
        "process": {"cmd": "/bin/sh", "args": ["-c", "tty; stty size; exit 4"]},
        "pty": {"size": {"cols": 100, "rows": 30}},
    }
    with agent.client() as c:
        _, frames = stream_call(c, "process.Process/Start", msg)
    out = _output(frames, "pty")
    assert b"/dev/pts/" in out and b"30 100" in out
    assert _output(frames, "stdout") == b""
    assert frames[-2][1]["event"]["end"]["exitCode"] == 4


def test_pty_end_comes_even_if_a_background_child_keeps_the_tty(agent: AgentProc) -> None:
    # No EOF/EIO on the master then (as under gVisor): the end must come from the exit alone.
    msg = {
        "process": {"cmd": "/bin/sh", "args": ["-c", "sleep 600 & echo bye"]},
        "pty": {"size": {"cols": 80, "rows": 24}},
    }
    with agent.client() as c:
        _, frames = stream_call(c, "process.Process/Start", msg)
    pid = frames[0][1]["event"]["start"]["pid"]
    try:
        assert b"bye" in _output(frames, "pty")
        assert frames[-2][1]["event"]["end"]["exited"] is True
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_update_and_close_stdin_errors(agent: AgentProc) -> None:
    msg = {"process": {"cmd": "/bin/sh", "args": ["-c", "sleep 0.3"]}, "tag": "plain"}
    with agent.client() as c:
        with c.stream("POST", "/process.Process/Start", content=_env(msg), headers=_stream_headers()) as r:
            it = r.iter_bytes()
            first = next(it)
            pid = int(first.split(b'"pid":')[1].split(b"}")[0])
            resize = {"process": {"pid": pid}, "pty": {"size": {"cols": 10, "rows": 10}}}
            assert unary(c, "process.Process/Update", resize).status_code == 500  # not a PTY
            bad_input = {"process": {"pid": pid}, "input": {"pty": "eA=="}}
            assert unary(c, "process.Process/SendInput", bad_input).status_code == 500
            for _ in it:
                pass
        assert unary(c, "process.Process/CloseStdin", {"process": {"pid": 999999}}).status_code == 404
        assert unary(c, "process.Process/SendSignal", {"process": {}, "signal": 9}).status_code == 400
        assert unary(c, "process.Process/SendSignal", {"signal": 9}).json()["code"] == "invalid_argument"


def test_children_get_oom_score_zero_and_default_signals(agent: AgentProc) -> None:
    msg = {
        "process": {
            "cmd": "/bin/sh",
            "args": ["-c", "cat /proc/self/oom_score_adj; grep -E '^Sig(Ign|Blk)' /proc/self/status"],
        }
    }
    with agent.client() as c:
        _, frames = stream_call(c, "process.Process/Start", msg, headers=ROOT)
    lines = _output(frames).decode().split("\n")
    assert lines[0] == "0"
    assert "SigIgn:\t0000000000000000" in lines and "SigBlk:\t0000000000000000" in lines
    with open(f"/proc/{agent.proc.pid}/oom_score_adj") as f:
        agent_score = f.read().strip()
    assert agent_score == ("-998" if _can_lower_oom_score() else "0")


def _can_lower_oom_score() -> bool:
    """Lowering needs CAP_SYS_RESOURCE, which a root inside some containers lacks."""
    import subprocess
    import sys

    probe = "f = open('/proc/self/oom_score_adj', 'w'); f.write('-998'); f.close()"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def test_agent_stops_cleanly_on_sigterm(fresh_agent: Callable[..., AgentProc]) -> None:
    agent = fresh_agent()
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(20) == 0


def test_idle_rss_is_under_20_mib(fresh_agent: Callable[..., AgentProc]) -> None:
    agent = fresh_agent()
    with agent.client() as c:
        assert c.get("/health").status_code == 204
    assert agent.rss_kib() < 20 * 1024


def _env(msg: dict[str, Any]) -> bytes:
    from .helpers import envelope

    return envelope(msg)


def _stream_headers() -> dict[str, str]:
    from .helpers import STREAM

    return {"content-type": STREAM}

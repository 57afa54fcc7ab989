"""The preStop drain script under dash against a real HTTP server on 127.0.0.1.

Deadlines are lowered to ~2 s and polls to 0.1 s. Timings are not asserted tightly: the
subprocess is bounded generously and the assertions are on what it printed and did.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from .shell import Result, needs_dash, run_script

API_KEY = "wrn_test_key"
CLIENTS = [c for c in ("curl", "wget") if shutil.which(c)]
DEADLINE_MESSAGE = "drain deadline of 2s reached"

pytestmark = [needs_dash, pytest.mark.skipif(not CLIENTS, reason="neither curl nor wget installed")]


class FakeApi:
    """``GET /v2/sandboxes``: 401 without the key, else a list whose length follows ``counts``.

    Each request takes the next count; the last one repeats. ``raw_body`` overrides the JSON.
    """

    def __init__(self) -> None:
        self.counts: list[int] = [0]
        self.raw_body: bytes | None = None
        self.requests: list[tuple[str, str | None]] = []
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                key = self.headers.get("X-API-Key")
                with api._lock:
                    api.requests.append((self.path, key))
                    count = api.counts.pop(0) if len(api.counts) > 1 else api.counts[0]
                if key != API_KEY:
                    self._send(401, b'{"code":401,"message":"invalid API key"}')
                elif not self.path.startswith("/v2/sandboxes"):
                    self._send(404, b'{"code":404,"message":"not found"}')
                else:
                    items = [{"sandboxID": f"sbx{i}", "templateID": "base", "state": "running"} for i in range(count)]
                    self._send(200, api.raw_body or json.dumps(items, indent=1).encode())

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v2/sandboxes?state=running"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)


@pytest.fixture
def api() -> Iterator[FakeApi]:
    server = FakeApi()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def closed_port_url() -> str:
    """A loopback port nothing listens on: bound, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v2/sandboxes"


@pytest.fixture(params=CLIENTS)
def client(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def drain(url: str, client: str, **extra: str) -> Result:
    env = {
        "DRAIN_URL": url,
        "DRAIN_HTTP": client,
        "DRAIN_DEADLINE_S": "2",
        "DRAIN_POLL_S": "0.1",
        "DRAIN_HTTP_TIMEOUT_S": "2",
        "WARREN_API_KEY": API_KEY,
        "WARREN_STATE_DIR": "/nonexistent",
    }
    env.update(extra)
    return run_script("prestop.sh", env)


def test_count_reaching_zero_exits_drained(api: FakeApi, client: str) -> None:
    api.counts = [3, 1, 0]
    result = drain(api.url, client)
    assert result.returncode == 0, result.output
    assert result.lines("drained: no running sandboxes"), result.output
    assert not result.lines("drain deadline"), result.output
    assert result.lines("poll 1: 3 running sandbox(es)")
    assert result.lines("poll 2: 1 running sandbox(es)")
    assert len(api.requests) == 3
    assert all(path == "/v2/sandboxes?state=running" and key == API_KEY for path, key in api.requests)


def test_count_staying_above_zero_stops_at_the_deadline(api: FakeApi, client: str) -> None:
    api.counts = [2]
    result = drain(api.url, client)
    assert result.returncode == 0, "exit 0 so the kubelet goes on to SIGTERM"
    assert result.lines(DEADLINE_MESSAGE), result.output
    assert "leaving remaining sandboxes to the server's graceful shutdown" in result.output
    assert len(result.lines("2 running sandbox(es)")) >= 2
    assert not result.lines("drained:")


def test_unreachable_api_is_retried_until_the_deadline(closed_port_url: str, client: str) -> None:
    result = drain(closed_port_url, client)
    assert result.returncode == 0, result.output
    assert len(result.lines("sandbox API unreachable or failing")) >= 2, result.output
    assert result.lines(DEADLINE_MESSAGE), result.output
    last = result.output.strip().splitlines()[-1]
    assert DEADLINE_MESSAGE in last


def test_wrong_key_is_a_failure_to_retry_not_a_drained_node(api: FakeApi, client: str) -> None:
    result = drain(api.url, client, WARREN_API_KEY="wrong")
    assert result.lines(DEADLINE_MESSAGE), result.output
    failing = result.lines("sandbox API unreachable or failing")
    assert len(failing) >= 2
    if client == "curl":
        assert "401" in failing[0]
    assert {key for _, key in api.requests} == {"wrong"}


def test_key_falls_back_to_the_state_dir_file(api: FakeApi, client: str, tmp_path: Path) -> None:
    (tmp_path / "api-key").write_text(API_KEY + "\n")
    api.counts = [0]
    result = drain(api.url, client, WARREN_API_KEY="", WARREN_STATE_DIR=str(tmp_path))
    assert result.lines("drained:"), result.output
    assert api.requests[0][1] == API_KEY


def test_a_response_that_is_not_a_list_is_retried(api: FakeApi, client: str) -> None:
    api.raw_body = b'{"message": "not a list"}'
    result = drain(api.url, client)
    assert len(result.lines("unexpected response (not a JSON array)")) >= 2, result.output
    assert result.lines(DEADLINE_MESSAGE)


def test_zero_deadline_gives_up_before_polling(api: FakeApi, client: str) -> None:
    result = drain(api.url, client, DRAIN_DEADLINE_S="0")
    assert result.returncode == 0
    assert result.lines("drain deadline of 0s reached after 0 poll(s)"), result.output
    assert api.requests == []


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("DRAIN_DEADLINE_S", "soon", "DRAIN_DEADLINE_S must be a whole number"),
        ("DRAIN_HTTP_TIMEOUT_S", "-1", "DRAIN_HTTP_TIMEOUT_S must be a whole number"),
        ("DRAIN_HTTP", "httpie", "DRAIN_HTTP must be curl or wget"),
    ],
)
def test_bad_settings_fail_fast_with_a_message(closed_port_url: str, var: str, value: str, message: str) -> None:
    result = drain(closed_port_url, CLIENTS[0], **{var: value})
    assert result.returncode == 2
    assert result.lines(message), result.output


def test_client_is_detected_when_not_given(api: FakeApi) -> None:
    result = drain(api.url, "")
    assert result.lines("drained:"), result.output
    assert result.lines(f"draining: waiting for running sandboxes to reach 0 (deadline 2s, {CLIENTS[0]} ")


def test_logs_go_to_the_stdout_of_the_process_named_in_the_pid_file(api: FakeApi, tmp_path: Path) -> None:
    """In the pod that process is the server, whose stdout is the container log."""
    log = tmp_path / "container.log"
    with open(log, "w") as out:
        server = subprocess.Popen(["sleep", "30"], stdout=out)
    try:
        pid_file = tmp_path / "instance.lock"
        pid_file.write_text(f"{server.pid}\n")
        result = drain(api.url, CLIENTS[0], DRAIN_LOG_PID_FILE=str(pid_file))
    finally:
        server.kill()
        server.wait()
    assert result.returncode == 0
    assert result.output == ""
    assert "drained: no running sandboxes" in log.read_text()


@pytest.mark.parametrize("content", ["", "not-a-pid", "dead"])
def test_unusable_pid_file_falls_back_to_our_own_stdout(api: FakeApi, tmp_path: Path, content: str) -> None:
    if content == "dead":
        gone = subprocess.Popen(["true"])
        gone.wait()
        content = str(gone.pid)
    pid_file = tmp_path / "instance.lock"
    pid_file.write_text(content)
    result = drain(api.url, CLIENTS[0], DRAIN_LOG_PID_FILE=str(pid_file))
    assert result.lines("drained:"), result.output
    missing = drain(api.url, CLIENTS[0], DRAIN_LOG_PID_FILE=str(tmp_path / "absent"))
    assert missing.lines("drained:"), missing.output

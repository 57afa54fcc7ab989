"""What a sandbox must not reach or exhaust, checked from inside real sandboxes."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from e2b import CommandExitException, Sandbox

from tests.framework.node import Node

_CONNECT = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        print(target, "OPEN")
    except OSError as exc:
        print(target, "CLOSED", type(exc).__name__)
"""
_WAIT_FOR_PORT = """
import socket, sys, time
deadline = time.monotonic() + 30
while True:
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), 1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
"""
_MY_ADDRESS = (
    "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
    "s.connect(('10.255.255.255', 1)); print(s.getsockname()[0])"
)
_GATEWAY = (
    "import socket, struct\n"
    "for line in open('/proc/net/route').readlines()[1:]:\n"
    "    f = line.split()\n"
    "    if f[1] == '00000000': print(socket.inet_ntoa(struct.pack('<L', int(f[2], 16))))"
)


def _host_addresses() -> list[str]:
    out = {"127.0.0.1"}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            out.add(s.getsockname()[0])
        except OSError:
            pass
    return sorted(out)


def _probe(sbx: Sandbox, targets: list[str]) -> dict[str, str]:
    sbx.files.write("/tmp/probe.py", _CONNECT)
    out = sbx.commands.run("python3 /tmp/probe.py " + " ".join(targets), timeout=60).stdout
    return {line.split()[0]: line.split()[1] for line in out.splitlines() if line.strip()}


def test_cannot_see_host_processes_or_files(sbx: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> None:
    marker = tmp_path_factory.mktemp("host-secret") / "secret.txt"
    marker.write_text("host-only")
    comms = sbx.commands.run("ps -eo comm --no-headers", user="root").stdout
    assert len(comms.splitlines()) < 20
    assert "pytest" not in comms and "warren" not in comms
    with pytest.raises(CommandExitException):
        sbx.commands.run(f"cat {marker}", user="root")
    assert sbx.commands.run("hostname").stdout.strip() == sbx.sandbox_id
    with pytest.raises(CommandExitException):
        sbx.commands.run("touch /.agent/x", user="root")


def test_cannot_reach_host_services_or_server(sbx: Sandbox, node: Node) -> None:
    listener = socket.create_server(("0.0.0.0", 0))
    port = listener.getsockname()[1]
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        sbx.files.write("/tmp/gw.py", _GATEWAY)
        gateway = sbx.commands.run("python3 /tmp/gw.py").stdout.strip()
        assert gateway
        targets = [f"{a}:{p}" for a in [*_host_addresses(), gateway] for p in (port, node.port)]
        results = _probe(sbx, targets)
        assert results and all(v == "CLOSED" for v in results.values()), results
        assert not accepted
    finally:
        stop.set()
        thread.join()
        listener.close()


def test_cannot_reach_another_sandbox(sbx: Sandbox, node: Node, template: str) -> None:
    other = Sandbox.create(template=template, timeout=120)
    try:
        other.commands.run("python3 -m http.server 8000", background=True)
        other_ip = other.commands.run(f'python3 -c "{_MY_ADDRESS}"').stdout.strip()
        other.files.write("/tmp/wait.py", _WAIT_FOR_PORT)
        assert other.commands.run("python3 /tmp/wait.py 127.0.0.1 8000", timeout=60).exit_code == 0
        results = _probe(sbx, [f"{other_ip}:8000", f"{other_ip}:49983"])
        assert set(results.values()) == {"CLOSED"}, results
    finally:
        other.kill()


def test_memory_bomb_is_contained(sbx: Sandbox, node: Node, runtime: str, template: str) -> None:
    """runc: the kernel OOM-kills the bomb inside the sandbox and the sandbox lives on.

    gVisor 2022 has no OOM killer of its own: the host cgroup bounds the whole sandbox, so the host
    kills the sandbox as a whole; warren notices (pidfd), removes it and ends its streams. Either way
    the node and the other sandboxes live.
    """
    neighbour = Sandbox.create(template=template, timeout=120)
    try:
        bomb = "python3 -c 'a = []\nwhile True: a.append(bytearray(32 * 1024 * 1024))'"
        with pytest.raises(Exception) as info:
            sbx.commands.run(bomb, timeout=300)
        if runtime == "runc":
            assert isinstance(info.value, CommandExitException) and info.value.exit_code != 0
            assert sbx.commands.run("echo alive").stdout.strip() == "alive"
        else:
            deadline = time.monotonic() + 30
            while sbx.is_running() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not sbx.is_running()
        assert node.proc is not None and node.proc.poll() is None
        assert neighbour.commands.run("echo fine").stdout.strip() == "fine"
    finally:
        neighbour.kill()


_FORKS = """
import os
n = 0
try:
    while n < 5000:
        if os.fork() == 0:
            os.execv('/bin/sleep', ['sleep', '60'])
        n += 1
    print('NOLIMIT', n)
except OSError as exc:
    print('LIMIT', n, exc.errno)
"""


def test_fork_bomb_stops_at_pids_limit(sbx: Sandbox, node: Node, runtime: str) -> None:
    """runc: fork fails inside at the pids limit. gVisor: the host pids limit bounds the sandbox."""
    sbx.files.write("/tmp/forks.py", _FORKS)
    try:
        out = sbx.commands.run("python3 /tmp/forks.py", timeout=300).stdout.split()
    except Exception:  # gVisor: the sandbox can be stopped as a whole
        assert runtime == "gvisor"
        assert node.proc is not None and node.proc.poll() is None
        return
    assert out[0] == "LIMIT", out
    assert int(out[1]) < 5000

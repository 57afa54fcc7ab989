"""Commands and PTYs through the unmodified E2B SDK (sync), on every runtime."""

from __future__ import annotations

import time

import pytest
from e2b import CommandExitException, Sandbox
from e2b.sandbox.commands.command_handle import PtySize


def test_run_stdout_stderr_exit_code(sbx: Sandbox) -> None:
    result = sbx.commands.run("echo out; echo err >&2")
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"
    assert result.exit_code == 0
    with pytest.raises(CommandExitException) as info:
        sbx.commands.run("echo boom >&2; exit 3")
    assert info.value.exit_code == 3
    assert "boom" in info.value.stderr


def test_run_cwd_envs_and_users(sbx: Sandbox) -> None:
    assert sbx.commands.run("pwd").stdout.strip() == "/home/user"
    assert sbx.commands.run("pwd", cwd="/tmp").stdout.strip() == "/tmp"
    assert sbx.commands.run("echo $A-$B", envs={"A": "1", "B": "2"}).stdout.strip() == "1-2"
    assert sbx.commands.run("whoami").stdout.strip() == "user"
    assert sbx.commands.run("whoami", user="root").stdout.strip() == "root"
    assert sbx.commands.run("echo $HOME", user="root").stdout.strip() == "/root"


def test_background_wait_and_kill(sbx: Sandbox) -> None:
    handle = sbx.commands.run("sleep 0.3; echo done", background=True)
    assert handle.wait().stdout.strip() == "done"
    long = sbx.commands.run("sleep 600", background=True)
    assert any(p.pid == long.pid for p in sbx.commands.list())
    assert sbx.commands.kill(long.pid) is True
    with pytest.raises(CommandExitException):
        long.wait()
    assert all(p.pid != long.pid for p in sbx.commands.list())
    assert sbx.commands.kill(long.pid) is False


def test_send_stdin(sbx: Sandbox) -> None:
    handle = sbx.commands.run("read line; echo got:$line", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "hello\n")
    assert handle.wait().stdout.strip() == "got:hello"


def test_command_killed_at_its_timeout(sbx: Sandbox) -> None:
    with pytest.raises(Exception):  # noqa: B017 - the SDK raises TimeoutException or CommandExitException
        sbx.commands.run("sleep 30", timeout=1)

    def sleeping() -> bool:
        return any("sleep 30" in " ".join([p.cmd, *p.args]) for p in sbx.commands.list())

    deadline = time.monotonic() + 10  # the agent kills at its deadline; the client gives up at the same time
    while sleeping() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not sleeping()


def test_pty_input_resize_output(sbx: Sandbox) -> None:
    pty = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
    out = bytearray()
    events = iter(pty)

    def read_until(marker: bytes) -> None:
        for _, _, chunk in events:
            if chunk:
                out.extend(chunk)
            if marker in out:
                return
        raise AssertionError(f"PTY ended before {marker!r}: {out!r}")

    sbx.pty.send_stdin(pty.pid, b"stty size; echo PTY_$((6*7))\n")
    read_until(b"PTY_42")
    assert b"24 80" in out
    sbx.pty.resize(pty.pid, PtySize(rows=40, cols=100))
    sbx.pty.send_stdin(pty.pid, b"stty size; echo END_$((1+1))\n")
    read_until(b"END_2")
    assert b"40 100" in out
    sbx.pty.send_stdin(pty.pid, b"exit\n")
    for _ in events:
        pass
    assert pty.wait().exit_code == 0

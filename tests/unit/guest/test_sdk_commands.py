"""Commands and PTYs through the unmodified e2b SDK (sync and async) against a real agent."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from e2b import CommandExitException, PtySize, Sandbox, TimeoutException

from .conftest import EXTRA_GID, USER_UID, AgentProc
from .helpers import make_async_sandbox, make_sandbox


@pytest.fixture(scope="module")
def sbx(agent: AgentProc) -> Iterator[Sandbox]:
    yield make_sandbox(agent.url)


def eventually(check: Callable[[], bool], what: str, limit_s: float = 20.0) -> None:
    """Poll ``check`` until it holds; fail after ``limit_s`` (a bound, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


def test_run_stdout_stderr_and_exit_code(sbx: Sandbox) -> None:
    r = sbx.commands.run("echo hello; echo oops >&2")
    assert (r.stdout, r.stderr, r.exit_code, r.error) == ("hello\n", "oops\n", 0, None)
    with pytest.raises(CommandExitException) as exc:
        sbx.commands.run("echo partial; exit 3")
    assert exc.value.exit_code == 3
    assert exc.value.stdout == "partial\n"
    assert exc.value.error == "exit status 3"


def test_run_callbacks_see_output(sbx: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    sbx.commands.run("for i in 1 2 3; do echo $i; done; echo e >&2", on_stdout=out.append, on_stderr=err.append)
    assert "".join(out) == "1\n2\n3\n" and "".join(err) == "e\n"


def test_run_cwd_and_envs(sbx: Sandbox, agent: AgentProc) -> None:
    assert sbx.commands.run("pwd").stdout.strip() == str(agent.home)
    (agent.home / "sub").mkdir(exist_ok=True)
    assert sbx.commands.run("pwd", cwd="sub").stdout.strip() == str(agent.home / "sub")
    assert sbx.commands.run("pwd", cwd="/tmp").stdout.strip() == "/tmp"
    r = sbx.commands.run('echo "$FOO:$HOME:$USER:$LOGNAME"', envs={"FOO": "bar baz"})
    assert r.stdout.strip() == f"bar baz:{agent.home}:user:user"
    assert "/usr/bin" in sbx.commands.run("echo $PATH").stdout


def test_run_as_root_versus_default_user(sbx: Sandbox) -> None:
    assert sbx.commands.run("id -u").stdout.strip() == str(USER_UID)
    groups = sbx.commands.run("id -G").stdout.split()
    assert str(EXTRA_GID) in groups  # supplementary groups from the group file
    r = sbx.commands.run("id -u; echo $HOME", user="root")
    assert r.stdout.split() == ["0", "/root"]


def test_files_made_by_default_user_commands_are_theirs(sbx: Sandbox, agent: AgentProc) -> None:
    sbx.commands.run("touch owned-by-user")
    assert (agent.home / "owned-by-user").stat().st_uid == USER_UID


def test_background_wait_and_kill(sbx: Sandbox) -> None:
    h = sbx.commands.run("sleep 60", background=True)
    assert h.pid in {p.pid for p in sbx.commands.list()}
    assert h.kill() is True
    with pytest.raises(CommandExitException) as exc:
        h.wait()
    assert exc.value.exit_code == -1
    assert exc.value.error == "signal: killed"
    eventually(lambda: h.pid not in {p.pid for p in sbx.commands.list()}, "killed process leaves the list")
    assert sbx.commands.kill(h.pid) is False  # not_found -> False


def test_background_wait_collects_output(sbx: Sandbox) -> None:
    h = sbx.commands.run("sleep 0.2; echo done", background=True)
    assert h.wait().stdout == "done\n"


def test_send_stdin_and_close_stdin(sbx: Sandbox) -> None:
    h = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "hello ")
    h.send_stdin(b"world\n")
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout == "hello world\n"


def test_stream_input(sbx: Sandbox) -> None:
    h = sbx.commands.run("wc -c", background=True, stdin=True)
    sbx.commands.stream_input(h.pid, (b"x" * 1000 for _ in range(100)))
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout.strip() == "100000"


def test_stdin_false_means_dev_null(sbx: Sandbox) -> None:
    assert sbx.commands.run("cat; echo end").stdout == "end\n"


def test_list_shows_config(sbx: Sandbox) -> None:
    h = sbx.commands.run("sleep 60", background=True, envs={"K": "V"}, cwd="/tmp")
    try:
        info = next(p for p in sbx.commands.list() if p.pid == h.pid)
        assert info.cmd == "/bin/bash"
        assert info.args[-1] == "sleep 60"
        assert info.envs == {"K": "V"}
        assert info.cwd == "/tmp"
    finally:
        h.kill()


def test_connect_and_several_watchers(sbx: Sandbox) -> None:
    h = sbx.commands.run("sleep 0.5; echo tick", background=True)
    again = sbx.commands.connect(h.pid)
    results: dict[str, str] = {}
    t = threading.Thread(target=lambda: results.update(first=h.wait().stdout))
    t.start()
    results["second"] = again.wait().stdout
    t.join(30)
    assert results == {"first": "tick\n", "second": "tick\n"}


def test_disconnect_does_not_kill(sbx: Sandbox) -> None:
    h = sbx.commands.run("sleep 1; echo still-here", background=True)
    h.disconnect()
    assert h.pid in {p.pid for p in sbx.commands.list()}
    assert sbx.commands.connect(h.pid).wait().stdout == "still-here\n"


def test_process_is_killed_at_its_timeout(sbx: Sandbox) -> None:
    h = sbx.commands.run("sleep 60", background=True, timeout=1)
    with pytest.raises((TimeoutException, CommandExitException)):
        h.wait()
    eventually(lambda: h.pid not in {p.pid for p in sbx.commands.list()}, "timed-out process is killed")


def test_process_outlives_no_timeout(sbx: Sandbox) -> None:
    h = sbx.commands.run("sleep 1.5; echo ok", background=True, timeout=0)
    assert h.wait().stdout == "ok\n"


def test_pty_create_input_resize_and_output(sbx: Sandbox) -> None:
    pty = sbx.pty.create(PtySize(rows=24, cols=80))
    events = iter(pty)
    seen = b""

    def read_until(marker: bytes) -> None:
        nonlocal seen
        while marker not in seen:
            _, _, chunk = next(events)
            if chunk is not None:
                seen += chunk

    try:
        sbx.pty.send_stdin(pty.pid, b"stty size; tty; echo PTY_OK $((6*7))\n")
        read_until(b"PTY_OK 42")
        sbx.pty.resize(pty.pid, PtySize(rows=40, cols=132))
        sbx.pty.send_stdin(pty.pid, b"stty size; exit\n")
        for _, _, chunk in events:
            if chunk is not None:
                seen += chunk
        result = pty.wait()
    finally:
        sbx.pty.kill(pty.pid)
    text = seen.decode(errors="replace")
    assert "24 80" in text and "40 132" in text
    assert "/dev/pts/" in text
    assert result.exit_code == 0


def test_pty_kill(sbx: Sandbox) -> None:
    pty = sbx.pty.create(PtySize(rows=10, cols=40))
    assert sbx.pty.kill(pty.pid) is True
    with pytest.raises(CommandExitException):
        pty.wait()


async def test_async_sdk_commands(agent: AgentProc) -> None:
    sbx = make_async_sandbox(agent.url)
    r = await sbx.commands.run("echo async; echo e >&2")
    assert (r.stdout, r.stderr) == ("async\n", "e\n")
    with pytest.raises(CommandExitException):
        await sbx.commands.run("exit 5")
    h = await sbx.commands.run("cat", background=True, stdin=True)
    await sbx.commands.send_stdin(h.pid, "piped")
    await sbx.commands.close_stdin(h.pid)
    assert (await h.wait()).stdout == "piped"
    h = await sbx.commands.run("sleep 60", background=True)
    assert await h.kill() is True
    with pytest.raises(CommandExitException):
        await h.wait()


def test_no_output_is_lost_when_the_process_exits_at_once(sbx: Sandbox) -> None:
    r = sbx.commands.run("seq 1 200000; seq 1 1000 >&2")
    assert r.stdout.count("\n") == 200000 and r.stdout.endswith("\n200000\n")
    assert r.stderr.count("\n") == 1000


def test_large_output_is_streamed(sbx: Sandbox, agent: AgentProc) -> None:
    before = agent.rss_kib()
    r = sbx.commands.run("head -c 30000000 /dev/zero | tr '\\0' a")
    assert len(r.stdout) == 30_000_000 and set(r.stdout) == {"a"}
    assert agent.rss_kib() - before < 32 << 10  # queued output is bounded (backpressure)


def test_background_grandchild_does_not_hold_the_command(sbx: Sandbox) -> None:
    import os
    import signal

    # The shell exits while its background child still holds stdout: the command still ends
    # (well before its 120 s deadline would kill it, which would raise instead).
    h = sbx.commands.run("sleep 600 & echo parent-done", background=True, timeout=120)
    try:
        assert h.wait().stdout == "parent-done\n"
    finally:
        try:
            os.killpg(h.pid, signal.SIGKILL)  # the orphaned sleep, still in the command's group
        except ProcessLookupError:
            pass

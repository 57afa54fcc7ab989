"""``attach_shell`` on a real pseudo-terminal, with a stand-in for the SDK's sandbox."""

from __future__ import annotations

import fcntl
import io
import os
import signal
import struct
import sys
import termios
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from warren.cli.client import CliError
from warren.cli.session import attach_shell

TYPED = b"ls\r\x03"


class _FakePty:
    def __init__(self, exit_code: int, master: int, slave: int) -> None:
        self.exit_code = exit_code
        self.master, self.slave = master, slave  # the user types on master; the CLI reads slave
        self.created: list[tuple[int, int, str | None]] = []
        self.inputs: list[bytes] = []
        self.resizes: list[tuple[int, int]] = []
        self.got_input = threading.Event()
        self.resized = threading.Event()

    def create(self, size: Any, user: str | None = None, timeout: float | None = None) -> _FakeHandle:
        assert timeout == 0
        self.created.append((size.rows, size.cols, user))
        return _FakeHandle(self)

    def send_stdin(self, pid: int, data: bytes) -> None:
        assert pid == 7
        self.inputs.append(data)
        self.got_input.set()

    def resize(self, pid: int, size: Any) -> None:
        self.resizes.append((size.rows, size.cols))
        self.resized.set()


class _FakeHandle:
    pid = 7

    def __init__(self, pty: _FakePty) -> None:
        self._pty = pty

    def wait(self, on_pty: Any) -> Any:
        from e2b.sandbox.commands.command_handle import CommandExitException, CommandResult

        on_pty(b"user@sandbox:~$ ")
        os.write(self._pty.master, TYPED)  # the terminal is raw by now
        deadline = time.monotonic() + 5
        while b"".join(self._pty.inputs) != TYPED and time.monotonic() < deadline:
            self._pty.got_input.wait(0.05)
        fcntl.ioctl(self._pty.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        os.kill(os.getpid(), signal.SIGWINCH)
        assert self._pty.resized.wait(5)
        if self._pty.exit_code:
            raise CommandExitException(stdout="", stderr="", exit_code=self._pty.exit_code, error=None)
        return CommandResult(stdout="", stderr="", exit_code=0, error=None)


class _FakeSandbox:
    def __init__(self, exit_code: int, master: int = -1, slave: int = -1) -> None:
        self.pty = _FakePty(exit_code, master, slave)


@pytest.fixture
def terminal() -> Iterator[tuple[int, int]]:
    """A pty pair (master, slave) with a 30x100 window."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    try:
        yield master, slave
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.parametrize("exit_code", [0, 5])
def test_attach_forwards_input_output_and_resizes(
    terminal: tuple[int, int], monkeypatch: pytest.MonkeyPatch, exit_code: int
) -> None:
    master, slave = terminal
    saved = termios.tcgetattr(slave)
    out = io.BytesIO()
    sandbox = _FakeSandbox(exit_code, master, slave)
    with open(slave, "rb", buffering=0, closefd=False) as stdin, io.TextIOWrapper(out) as stdout:
        # Patched here, not in a fixture: pytest's capture swaps sys.stdout again after fixtures ran.
        monkeypatch.setattr(sys, "stdin", stdin)
        monkeypatch.setattr(sys, "stdout", stdout)
        assert attach_shell(sandbox, user="root") == exit_code  # type: ignore[arg-type]
        written = out.getvalue()
        monkeypatch.undo()
    assert sandbox.pty.created == [(30, 100, "root")]
    assert b"".join(sandbox.pty.inputs) == TYPED  # raw: no CR->NL, and Ctrl-C is a byte, not SIGINT
    assert sandbox.pty.resizes[-1] == (40, 120)
    assert written == b"user@sandbox:~$ "
    assert termios.tcgetattr(slave) == saved  # the terminal is back in its old mode


def test_attach_without_a_terminal_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with pytest.raises(CliError, match="terminal"):
        attach_shell(_FakeSandbox(0), user=None)  # type: ignore[arg-type]

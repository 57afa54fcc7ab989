"""Talking to a sandbox through the unmodified E2B SDK: run a command, or attach a terminal.

The SDK is pointed at the warren server for both planes (``api_url`` and ``sandbox_url`` are the
server URL), exactly as an E2B user would do it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
import threading
import tty
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

from warren.cli import output
from warren.cli.client import CliError
from warren.cli.config import ClientConfig

if TYPE_CHECKING:
    from e2b import Sandbox
    from e2b.sandbox.commands.command_handle import PtySize

STDIN_CHUNK = 4096


def connect_sandbox(config: ClientConfig, sandbox_id: str) -> Sandbox:
    """Connect the SDK to a running (or paused: this resumes it) sandbox."""
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    try:
        return Sandbox.connect(sandbox_id, api_key=config.api_key or "", api_url=config.url, sandbox_url=config.url)
    except SandboxException as exc:
        raise CliError(str(exc) or type(exc).__name__) from exc


def run_command(sandbox: Sandbox, command: str, *, user: str | None, timeout: float) -> int:
    """Run ``command`` with ``/bin/bash -l -c``, streaming its output; return its exit code."""
    from e2b.exceptions import SandboxException
    from e2b.sandbox.commands.command_handle import CommandExitException

    def out(chunk: str) -> None:
        sys.stdout.write(chunk)
        sys.stdout.flush()

    def err(chunk: str) -> None:
        sys.stderr.write(chunk)
        sys.stderr.flush()

    try:
        result = sandbox.commands.run(
            command, user=user, timeout=timeout, on_stdout=out, on_stderr=err, retain_output=False
        )
    except CommandExitException as exc:
        return int(exc.exit_code)
    except SandboxException as exc:
        raise CliError(str(exc) or type(exc).__name__) from exc
    return int(result.exit_code)


def attach_shell(sandbox: Sandbox, *, user: str | None) -> int:
    """Open ``/bin/bash -i -l`` on a PTY in the sandbox and wire it to this terminal.

    The local terminal goes to raw mode; keystrokes go to the PTY, PTY output to stdout, and a
    window resize (SIGWINCH) resizes the PTY. Returns the shell's exit code.
    """
    from e2b.exceptions import SandboxException
    from e2b.sandbox.commands.command_handle import CommandExitException

    if not output.stdin_is_tty():
        raise CliError("an interactive shell needs a terminal on stdin")
    stdin_fd = sys.stdin.fileno()
    try:
        handle = sandbox.pty.create(_terminal_size(), user=user, timeout=0)
    except SandboxException as exc:
        raise CliError(str(exc) or type(exc).__name__) from exc
    stdout = sys.stdout.buffer

    def on_pty(data: bytes) -> None:
        stdout.write(data)
        stdout.flush()

    with _raw_terminal(stdin_fd), _Forwarder(sandbox, handle.pid, stdin_fd):
        try:
            result = handle.wait(on_pty=on_pty)
        except CommandExitException as exc:
            return int(exc.exit_code)
        except SandboxException as exc:
            raise CliError(str(exc) or type(exc).__name__) from exc
    return int(result.exit_code)


class _Forwarder:
    """A thread that sends stdin to the PTY and applies window resizes (woken by a self-pipe)."""

    def __init__(self, sandbox: Sandbox, pid: int, stdin_fd: int) -> None:
        self._sandbox, self._pid, self._stdin_fd = sandbox, pid, stdin_fd
        self._wake_r, self._wake_w = os.pipe()
        self._stop = threading.Event()
        self._resized = threading.Event()
        self._thread = threading.Thread(target=self._run, name="warren-pty-stdin", daemon=True)
        self._old_handler: Any = None

    def __enter__(self) -> _Forwarder:
        self._old_handler = signal.signal(signal.SIGWINCH, self._on_winch)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        signal.signal(signal.SIGWINCH, self._old_handler)
        self._stop.set()
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _on_winch(self, _signum: int, _frame: FrameType | None) -> None:
        self._resized.set()
        os.write(self._wake_w, b"w")

    def _run(self) -> None:
        from e2b.exceptions import SandboxException

        while not self._stop.is_set():
            ready, _, _ = select.select([self._stdin_fd, self._wake_r], [], [])
            if self._wake_r in ready:
                os.read(self._wake_r, 64)
            try:
                if self._resized.is_set():
                    self._resized.clear()
                    self._sandbox.pty.resize(self._pid, _terminal_size())
                if self._stdin_fd in ready:
                    data = os.read(self._stdin_fd, STDIN_CHUNK)
                    if not data:
                        return
                    self._sandbox.pty.send_stdin(self._pid, data)
            except SandboxException:
                return  # the shell is gone; the main thread sees its end event


def _terminal_size() -> PtySize:
    from e2b.sandbox.commands.command_handle import PtySize

    for stream in (sys.stdin, sys.stdout):
        try:
            cols, rows = os.get_terminal_size(stream.fileno())
            return PtySize(rows=rows, cols=cols)
        except (OSError, ValueError):
            continue
    return PtySize(rows=24, cols=80)


@contextlib.contextmanager
def _raw_terminal(fd: int) -> Iterator[None]:
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)  # TCSANOW: keep what was typed ahead while connecting
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)

"""Child processes: spawn as a user, fan their output out to any number of streams, feed stdin or a
PTY, and report how they ended.

Exit is detected with SIGCHLD + ``waitpid`` (never from EOF on the output: under gVisor a PTY master
gives no EOF/EIO after the child exits). Each child starts in its own session, so a kill or a timeout
signals the whole process group, and nothing a command does to its group reaches the agent.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import RpcError
from .spawning import Spawner, set_winsize

if TYPE_CHECKING:
    from subprocess import Popen

    from .users import User

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STD_CHUNK = 32 * 1024
"""Read size for stdout/stderr pipes (envd's)."""
PTY_CHUNK = 16 * 1024
HIGH_WATER = 4 << 20
"""Bytes queued for one stream before the agent stops reading the child's output (backpressure)."""
LOW_WATER = 1 << 20
PTY_QUIET_S = 0.05
"""After a PTY child exits, output still in the tty layer is drained until it is quiet this long..."""
PTY_DRAIN_MAX_S = 2.0
"""...or for at most this long (gVisor's master never reports EOF/EIO)."""

_GO_SIGNAL_NAMES = {
    1: "hangup",
    2: "interrupt",
    3: "quit",
    4: "illegal instruction",
    5: "trace/breakpoint trap",
    6: "aborted",
    7: "bus error",
    8: "floating point exception",
    9: "killed",
    10: "user defined signal 1",
    11: "segmentation fault",
    12: "user defined signal 2",
    13: "broken pipe",
    14: "alarm clock",
    15: "terminated",
    24: "CPU time limit exceeded",
    25: "file size limit exceeded",
}
"""Names Go's ``syscall.Signal.String`` gives, so ``status`` reads like envd's (``signal: killed``)."""


@dataclass(frozen=True)
class SpawnSpec:
    """What to run and how; ``config`` is the request's ProcessConfig, echoed by List."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    user: User
    pty_size: tuple[int, int] | None
    stdin: bool
    tag: str | None
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExitInfo:
    exit_code: int
    exited: bool
    status: str
    error: str | None

    @classmethod
    def from_wait_status(cls, status: int) -> ExitInfo:
        if os.WIFEXITED(status):
            code = os.WEXITSTATUS(status)
            text = f"exit status {code}"
            return cls(code, True, text, None if code == 0 else text)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            text = "signal: " + _GO_SIGNAL_NAMES.get(sig, f"signal {sig}")
            if os.WCOREDUMP(status):
                text += " (core dumped)"
            return cls(-1, False, text, text)
        return cls(-1, False, f"wait status {status}", f"wait status {status}")

    def to_event(self) -> dict[str, Any]:
        end: dict[str, Any] = {"status": self.status}
        if self.exit_code:
            end["exitCode"] = self.exit_code
        if self.exited:
            end["exited"] = True
        if self.error is not None:
            end["error"] = self.error
        return {"event": {"end": end}}


def _dumps(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode()


class Subscriber:
    """One stream's view of a process: serialized events queued until the stream sends them."""

    def __init__(self, proc: ManagedProcess) -> None:
        self._proc = proc
        self._queue: deque[bytes] = deque()
        self._wakeup = asyncio.Event()
        self.pending = 0
        self.finished = False
        """Set once the end event is queued: it is the last item."""

    def push(self, payload: bytes, *, last: bool = False) -> None:
        self._queue.append(payload)
        self.pending += len(payload)
        if last:
            self.finished = True
        self._wakeup.set()

    async def get(self, idle_s: float | None) -> bytes | None:
        """The next event, or None if ``idle_s`` passed first (time for a keepalive)."""
        while not self._queue:
            self._wakeup.clear()
            try:
                async with asyncio.timeout(idle_s):
                    await self._wakeup.wait()
            except TimeoutError:
                return None
        payload = self._queue.popleft()
        self.pending -= len(payload)
        if self._proc.paused and self.pending < LOW_WATER:
            self._proc.maybe_resume()
        return payload

    @property
    def drained(self) -> bool:
        return self.finished and not self._queue


class ManagedProcess:
    """A running child and its output plumbing. Created by ``ProcessTable.spawn``."""

    def __init__(
        self,
        table: ProcessTable,
        spec: SpawnSpec,
        popen: Popen[bytes],
        outputs: dict[int, str],
        stdin_fd: int | None,
        pty_fd: int | None,
    ) -> None:
        self._table = table
        self._loop = table.loop
        self.pid: int = popen.pid
        self.tag = spec.tag
        self.config = spec.config
        self._popen = popen
        self._outputs = outputs  # fd -> "stdout" | "stderr" | "pty", while open
        self._stdin_fd = stdin_fd
        self._pty_fd = pty_fd
        self._stdin_lock = asyncio.Lock()
        self._subscribers: set[Subscriber] = set()
        self.paused = False
        self.exit: ExitInfo | None = None
        self.timed_out = False
        self.done = asyncio.Event()
        self._deadline: asyncio.TimerHandle | None = None
        self._drain_until = 0.0
        self._chunk = PTY_CHUNK if pty_fd is not None else STD_CHUNK
        for fd in outputs:
            os.set_blocking(fd, False)
            self._loop.add_reader(fd, self._on_readable, fd)

    @property
    def is_pty(self) -> bool:
        return self._pty_fd is not None

    # ------------------------------------------------------------------ subscribers

    def subscribe(self) -> Subscriber:
        sub = Subscriber(self)
        if self.exit is not None and self.done.is_set():
            sub.push(_dumps(self.exit.to_event()), last=True)
        else:
            self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)
        if self.paused:
            self.maybe_resume()

    def _broadcast(self, payload: bytes, *, last: bool = False) -> None:
        for sub in self._subscribers:
            sub.push(payload, last=last)

    # ------------------------------------------------------------------ output

    def _read(self, fd: int) -> bytes | None:
        """One read: data, b"" at the end (EOF, or EIO from a PTY master), None if nothing is ready."""
        try:
            return os.read(fd, self._chunk)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def _on_readable(self, fd: int) -> None:
        data = self._read(fd)
        if data is None:
            return
        if not data:
            self._close_output(fd)
            return
        self._emit_data(fd, data)
        if any(sub.pending > HIGH_WATER for sub in self._subscribers):
            self._pause()

    def _emit_data(self, fd: int, data: bytes) -> None:
        kind = self._outputs.get(fd)
        if kind is None or not self._subscribers:
            return
        payload = _dumps({"event": {"data": {kind: base64.b64encode(data).decode("ascii")}}})
        self._broadcast(payload)

    def _pause(self) -> None:
        if self.paused or self.exit is not None:
            return
        self.paused = True
        for fd in self._outputs:
            self._loop.remove_reader(fd)

    def maybe_resume(self) -> None:
        if not self.paused or any(sub.pending >= LOW_WATER for sub in self._subscribers):
            return
        self.paused = False
        if self.exit is None:
            for fd in self._outputs:
                self._loop.add_reader(fd, self._on_readable, fd)

    def _close_output(self, fd: int) -> None:
        if fd not in self._outputs:
            return
        self._loop.remove_reader(fd)
        del self._outputs[fd]
        if fd != self._pty_fd:
            os.close(fd)

    # ------------------------------------------------------------------ input and control

    async def write_input(self, data: bytes, *, pty: bool) -> None:
        """Write to stdin (``pty`` False) or to the terminal (``pty`` True)."""
        if pty != self.is_pty:
            raise RpcError(
                "internal",
                "tty assigned to process — input should be written to the pty, not the stdin"
                if self.is_pty
                else "tty not assigned to process — input should be written to the stdin, not the tty",
            )
        async with self._stdin_lock:
            view = memoryview(data)
            while view:
                fd = self._pty_fd if pty else self._stdin_fd
                if fd is None or (self.exit is not None and self.done.is_set()):
                    raise RpcError("internal", "stdin not enabled or closed")
                try:
                    n = os.write(fd, view)
                except BlockingIOError:
                    await self._wait_writable(fd)
                    continue
                except OSError as exc:
                    raise RpcError("internal", f"error writing to stdin of process {self.pid}: {exc}") from None
                view = view[n:]

    async def _wait_writable(self, fd: int) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()

        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        self._loop.add_writer(fd, ready)
        try:
            await fut
        finally:
            self._loop.remove_writer(fd)

    def close_stdin(self) -> None:
        if self.is_pty:
            raise RpcError("unknown", "cannot close stdin for PTY process — send Ctrl+D (0x04) instead")
        fd, self._stdin_fd = self._stdin_fd, None
        if fd is not None:
            os.close(fd)

    def resize(self, cols: int, rows: int) -> None:
        if self._pty_fd is None:
            raise RpcError("internal", "tty not assigned to process")
        set_winsize(self._pty_fd, cols, rows)

    def send_signal(self, sig: int) -> None:
        """Signal the process group (the child is a session leader); fall back to the pid."""
        if self.exit is not None:
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(self.pid, sig)

    def set_deadline(self, seconds: float) -> None:
        """Kill the process when ``seconds`` have passed (the request's Connect-Timeout-Ms)."""
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self._loop.call_later(seconds, self._on_deadline)

    def _on_deadline(self) -> None:
        self._deadline = None
        if self.exit is None:
            self.timed_out = True
            self.send_signal(signal.SIGKILL)

    # ------------------------------------------------------------------ exit

    def on_exit(self, status: int) -> None:
        """Called by the table's reaper with the wait status."""
        if self.exit is not None:
            return
        self.exit = ExitInfo.from_wait_status(status)
        self._popen.returncode = self.exit.exit_code
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        for fd in list(self._outputs):
            self._loop.remove_reader(fd)
        self._drain()
        if self._pty_fd is not None and self._pty_fd in self._outputs:
            # Output the child wrote just before exiting may still be in the tty layer.
            self._drain_until = self._loop.time() + PTY_DRAIN_MAX_S
            self._loop.call_later(PTY_QUIET_S, self._drain_pty_quiet)
            return
        self._finish()

    def _drain(self) -> bool:
        """Read whatever is ready on every output now; True if anything was read."""
        got = False
        for fd in list(self._outputs):
            while True:
                data = self._read(fd)
                if data is None:
                    break
                if not data:
                    self._close_output(fd)
                    break
                got = True
                self._emit_data(fd, data)
        return got

    def _drain_pty_quiet(self) -> None:
        got = self._drain()
        if got and self._outputs and self._loop.time() < self._drain_until:
            self._loop.call_later(PTY_QUIET_S, self._drain_pty_quiet)
            return
        self._finish()

    def _finish(self) -> None:
        assert self.exit is not None
        # Pipe ends still held by grandchildren are closed, like envd (Go's cmd.Wait).
        for fd in list(self._outputs):
            self._close_output(fd)
        for held in (self._stdin_fd, self._pty_fd):
            if held is not None:
                os.close(held)
        self._stdin_fd = self._pty_fd = None
        self._table.forget(self)
        self._broadcast(_dumps(self.exit.to_event()), last=True)
        self._subscribers.clear()
        self.done.set()

    def close(self) -> None:
        """Agent shutdown: kill the child; its exit is not reported any more."""
        self.send_signal(signal.SIGKILL)


class ProcessTable:
    """The agent's children by pid, and the SIGCHLD reaper that ends them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._by_pid: dict[int, ManagedProcess] = {}
        self._spawner = Spawner()

    def running(self) -> list[ManagedProcess]:
        return [p for p in self._by_pid.values() if p.exit is None]

    def get(self, pid: int) -> ManagedProcess | None:
        return self._by_pid.get(pid)

    def by_tag(self, tag: str) -> ManagedProcess | None:
        for proc in self._by_pid.values():
            if proc.tag == tag:
                return proc
        return None

    def forget(self, proc: ManagedProcess) -> None:
        if self._by_pid.get(proc.pid) is proc:
            del self._by_pid[proc.pid]

    def reap(self) -> None:
        """Collect every exited child (SIGCHLD handler); orphans reparented to us are reaped too."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            proc = self._by_pid.get(pid)
            if proc is not None:
                proc.on_exit(status)

    def close(self) -> None:
        for proc in list(self._by_pid.values()):
            proc.close()

    def spawn(self, spec: SpawnSpec) -> ManagedProcess:
        """Start ``spec``; RpcError(invalid_argument) if it cannot be started (envd's code)."""
        import subprocess

        parent_fds: list[int] = []
        child_fds: list[int] = []
        outputs: dict[int, str] = {}
        stdin_fd: int | None = None
        pty_fd: int | None = None
        try:
            if spec.pty_size is not None:
                master, slave = os.openpty()
                parent_fds.append(master)
                child_fds.append(slave)
                cols, rows = spec.pty_size
                set_winsize(master, cols, rows)
                os.set_blocking(master, False)
                stdin: int = slave
                stdout: int = slave
                stderr: int = slave
                pty_fd = master
                outputs[master] = "pty"
            else:
                out_r, out_w = os.pipe2(os.O_CLOEXEC)
                err_r, err_w = os.pipe2(os.O_CLOEXEC)
                parent_fds += [out_r, err_r]
                child_fds += [out_w, err_w]
                outputs[out_r] = "stdout"
                outputs[err_r] = "stderr"
                stdout, stderr = out_w, err_w
                if spec.stdin:
                    in_r, in_w = os.pipe2(os.O_CLOEXEC)
                    parent_fds.append(in_w)
                    child_fds.append(in_r)
                    os.set_blocking(in_w, False)
                    stdin_fd = in_w
                    stdin = in_r
                else:
                    stdin = subprocess.DEVNULL
            popen = self._spawner.popen(
                spec.argv,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                cwd=spec.cwd,
                env=spec.env,
                user=spec.user,
                pty=pty_fd is not None,
            )
        except BaseException as exc:
            for fd in parent_fds + child_fds:
                os.close(fd)
            if isinstance(exc, (OSError, subprocess.SubprocessError, ValueError)):
                cmd = " ".join(spec.argv)
                raise RpcError("invalid_argument", f"error starting process '{cmd}': {exc}") from None
            raise
        for fd in child_fds:
            os.close(fd)
        proc = ManagedProcess(self, spec, popen, outputs, stdin_fd, pty_fd)
        self._by_pid[proc.pid] = proc
        return proc

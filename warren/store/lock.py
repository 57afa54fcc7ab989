"""The node instance lock: at most one warren server per state dir.

Two servers on one state dir would both reap "orphaned" runtimes, allocate the same sandbox
addresses and write the same database. The lock is what lets start-up cleanup assume that
everything it finds in the state dir belongs to a *previous* incarnation, never a live one.

Why ``flock`` on a file:

* The kernel drops the lock when the last descriptor of the open file description closes,
  which includes SIGKILL and OOM of the holder. No stale-lock detection by pid is needed.
* The descriptor is opened ``O_CLOEXEC`` (Python's default, PEP 446), so runtime processes the
  server spawns do not inherit it and cannot pin the lock after the server dies.
* flock works across PID namespaces on the same filesystem, e.g. an old pod still terminating
  on the same hostPath; that old holder is exactly why acquisition retries within a budget
  instead of failing at once.

The lock file is never unlinked: removing it would let a contender lock a fresh inode while
another still holds the old one. The holder writes its pid into the file so a contender can
name it in its error (that pid is in the holder's PID namespace, which may not be ours).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType

from ..errors import HostError, UnavailableError

INSTANCE_LOCK_NAME = "instance.lock"
"""The lock file's name inside the state dir."""

_CONTENDED = frozenset({errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES})


class LockTimeoutError(UnavailableError):
    """Another process held the instance lock for the whole retry budget."""

    def __init__(self, path: Path, holder: str, budget_s: float, attempts: int) -> None:
        self.path = path
        self.holder = holder
        self.budget_s = budget_s
        self.attempts = attempts
        super().__init__(
            f"instance lock {path} is held by pid {holder} (another warren server on this state dir? "
            f"the pid is as the holder sees it, possibly in another PID namespace); "
            f"gave up after {budget_s:g}s and {attempts} attempt(s)"
        )


class InstanceLock:
    """A held instance lock. ``release()`` is idempotent; ``with lock:`` releases on exit."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def fileno(self) -> int:
        """The locked descriptor (for tests and diagnostics); raises once released."""
        if self._fd is None:
            raise ValueError(f"instance lock {self.path} is released")
        return self._fd

    def release(self) -> None:
        """Clear our pid, unlock, close; the file stays (see the module docstring).

        The pid is cleared while still locked so that a contender never names a process that
        no longer holds the lock: between the next holder's flock and its pid write, a contender
        reads an empty file and says "unknown" rather than blaming us.
        """
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> InstanceLock:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"InstanceLock({str(self.path)!r}, held={self.held})"


async def acquire_instance_lock(
    path: Path,
    *,
    budget_s: float = 120.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    initial_backoff_s: float = 0.05,
    max_backoff_s: float = 5.0,
) -> InstanceLock:
    """Take the lock at ``path``, retrying with exponential backoff for at most ``budget_s``.

    The budget is a strict bound on when attempts start. The deadline is computed once. Every
    attempt after the first is preceded by a deadline check, and no sleep is allowed to carry
    the next attempt past the deadline: the last one is shortened to land exactly on it, so the
    final attempt happens *at* the deadline rather than a whole backoff before or after it.
    The first attempt always happens, so a budget of 0 means "try once".

    That final, deadline-aimed attempt is made even if the event loop wakes it a little late
    (timers fire at or after their due time, never before); without that, every real-clock run
    would skip it and silently shorten the budget by up to ``max_backoff_s``. Any other wake-up
    past the deadline (a stalled loop) ends the retries without another attempt.

    Raises ``LockTimeoutError`` (an ``UnavailableError``) naming the path, the holder's pid and
    the budget; ``HostError`` if the lock file cannot be opened or locked for another reason.
    """
    if budget_s < 0 or initial_backoff_s <= 0 or max_backoff_s < initial_backoff_s:
        raise ValueError("need budget_s >= 0 and 0 < initial_backoff_s <= max_backoff_s")
    fd = _open_lock_file(path)
    try:
        start = clock()
        deadline = start + budget_s
        backoff = initial_backoff_s
        attempts = 0
        aimed_at_deadline = False
        now = start
        while True:
            if now > deadline and not aimed_at_deadline:
                break
            attempts += 1
            if _try_flock(fd, path):
                _write_pid(fd, path)
                return InstanceLock(path, fd)
            if aimed_at_deadline:
                break
            remaining = deadline - clock()
            if remaining <= 0:
                break
            aimed_at_deadline = backoff >= remaining
            await sleep(remaining if aimed_at_deadline else backoff)
            backoff = min(backoff * 2, max_backoff_s)
            now = clock()
    except BaseException:
        os.close(fd)
        raise
    holder = read_holder_pid(fd)
    os.close(fd)
    raise LockTimeoutError(path, holder, budget_s, attempts)


def read_holder_pid(fd: int) -> str:
    """The pid the holder wrote, or ``"unknown"`` (unreadable, empty, or not yet written)."""
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace")
    except OSError:
        return "unknown"
    first = text.split(maxsplit=1)[0] if text.strip() else ""
    return first if first.isdigit() else "unknown"


def _open_lock_file(path: Path) -> int:
    """Open without truncating: a contender must not wipe the holder's pid."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise HostError(f"cannot open instance lock {path}: {exc.strerror or exc}") from exc


def _try_flock(fd: int, path: Path) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in _CONTENDED:
            return False
        raise HostError(f"cannot lock {path}: {exc.strerror or exc}") from exc
    return True


def _write_pid(fd: int, path: Path) -> None:
    """Replace the file's content with our pid; only the holder ever writes."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    except OSError as exc:
        fcntl.flock(fd, fcntl.LOCK_UN)
        raise HostError(f"cannot write pid into instance lock {path}: {exc.strerror or exc}") from exc

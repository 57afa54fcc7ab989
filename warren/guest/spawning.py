"""Starting a child: a fresh session, the requested user, default signals and an OOM score of 0.

The child set-up was a Python ``preexec_fn``: the interpreter forks, and the child runs Python code
(touching, so copying, much of the agent's memory) before it execs: 4-6 ms a command. Where the same
start can be had without it, the fork/exec is done by ``_posixsubprocess`` in C:

* user and groups: ``user``/``group``/``extra_groups`` (setgroups, setregid, setreuid, as before);
* signals: exec resets caught signals; ``restore_signals`` the ones Python ignores (SIGPIPE, SIGXFSZ).
  The fast path is taken only while no other signal is ignored and none is blocked;
* the OOM score: the child inherits the agent's at fork. When the agent's is not 0, the agent holds
  0 for the duration of the fork and then takes its own back (it checks at start that it may).
  When it cannot go to 0 (a floor the host set, as for hardened sandboxes) the child keeps the
  agent's score, as the Python set-up's own write of 0 failed too; the agent stops trying.

PTY children (TIOCSCTTY) and an agent that cannot switch to the user keep the Python set-up.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .users import User

log = logging.getLogger("warren.guest")

_OWN_OOM = "/proc/self/oom_score_adj"
_RESTORED = frozenset({signal.SIGPIPE, signal.SIGXFSZ})
"""Signals ``restore_signals`` puts back to default in the child."""
_UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)

_Stdio = int | IO[Any] | None


def _read_oom() -> str | None:
    try:
        with open(_OWN_OOM) as f:
            return f.read().strip()
    except OSError:
        return None


def _write_oom(value: str) -> bool:
    try:
        with open(_OWN_OOM, "w") as f:
            f.write(value)
        return True
    except OSError:
        return False


def _can_take_back_oom() -> bool:
    """Whether the agent may raise its OOM score to 0 for a fork and then lower it again: it can
    always raise it, and it can lower it back to a score it may already write (a no-op write)."""
    own = _read_oom()
    return own is None or own == "0" or _write_oom(own)


def _ignored_signals() -> set[int]:
    ignored = set()
    for sig in signal.valid_signals():
        if sig in _UNCATCHABLE:
            continue
        try:
            if signal.getsignal(sig) is signal.SIG_IGN:
                ignored.add(int(sig))
        except (OSError, ValueError):
            continue
    return ignored


class Spawner:
    """Starts children for the process table; probes once what the C fork/exec can do alone."""

    def __init__(self) -> None:
        self._euid = os.geteuid()
        self._plain = _can_take_back_oom() and not (_ignored_signals() - _RESTORED)
        self._floored = False
        """A child cannot lower its score to 0 either (a floor the host set): children inherit it."""

    def _fast(self, user: User, pty: bool) -> bool:
        if not self._plain or pty:
            return False
        if self._euid != 0 and user.uid != self._euid:
            return False  # the Python set-up reports this its own way
        return not signal.pthread_sigmask(signal.SIG_BLOCK, ())

    def popen(
        self,
        argv: list[str],
        *,
        stdin: _Stdio,
        stdout: _Stdio,
        stderr: _Stdio,
        cwd: str,
        env: dict[str, str],
        user: User,
        pty: bool,
    ) -> subprocess.Popen[bytes]:
        common: dict[str, Any] = {
            "stdin": stdin,
            "stdout": stdout,
            "stderr": stderr,
            "cwd": cwd,
            "env": env,
            "close_fds": True,
            "restore_signals": True,
            "start_new_session": True,
        }
        if not self._fast(user, pty):
            return subprocess.Popen(argv, preexec_fn=child_setup(user, pty=pty), **common)
        if self._euid == 0:
            common.update(user=user.uid, group=user.gid, extra_groups=list(user.groups))
        own = None if self._floored else _read_oom()
        if own is None or own == "0":
            return subprocess.Popen(argv, **common)
        if not _write_oom("0"):
            self._floored = True  # the Python set-up's write of 0 failed the same way
            return subprocess.Popen(argv, **common)
        try:
            return subprocess.Popen(argv, **common)
        finally:
            if not _write_oom(own):
                log.error("the agent could not take back its OOM score %s", own)


def set_winsize(fd: int, cols: int, rows: int) -> None:
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def child_setup(user: User, *, pty: bool) -> Callable[[], None]:
    """The code run in the child between fork and exec (after setsid)."""
    if pty:
        import fcntl
        import termios

        tiocsctty = termios.TIOCSCTTY
        ioctl = fcntl.ioctl
    euid = os.geteuid()
    reset = [s for s in signal.valid_signals() if s not in _UNCATCHABLE]

    def setup() -> None:
        # Before dropping privileges: /proc/self is no longer ours to write after setuid.
        try:
            with open(_OWN_OOM, "w") as f:
                f.write("0")
        except OSError:
            pass
        for sig in reset:
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        if pty:
            ioctl(0, tiocsctty, 0)
        if euid == 0:
            os.setgroups(list(user.groups))
            os.setgid(user.gid)
            os.setuid(user.uid)
        elif user.uid != euid:
            raise PermissionError(errno.EPERM, f"the agent cannot run processes as user '{user.name}'")

    return setup

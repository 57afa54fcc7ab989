"""Signalling processes that warren did not spawn in this incarnation, without ever hitting a reused pid.

A pid alone names nothing: once its process exits and is reaped the kernel hands the number to the
next fork. A :class:`ProcessIdentity` is a pid plus what makes it *that* process: its start time
(field 22 of ``/proc/PID/stat``, clock ticks since boot) and the cgroup it must be in (the ownership
marker, e.g. ``/warren/<sandbox id>``). Every signal goes through :func:`signal_if_same`, which opens a
pidfd first, then re-reads the identity, then signals through the pidfd: a process that exits after
the check cannot pass its pid on to the signal (the pidfd still names the old process, so the kernel
answers ESRCH). A process whose start time changed (a reused pid) or that left the cgroup is never
signalled.

Usage::

    ids = [i for pid in pids if (i := read_identity(pid, "/warren/sbx1")) is not None]
    result = await terminate_group(ids, grace_s=5)   # SIGTERM, wait, re-check, SIGKILL the same ones
    assert not result.survivors

``proc`` parameters exist for tests (a fake ``/proc`` tree); the signals always go to real pids.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PROC",
    "ProcessIdentity",
    "TerminateResult",
    "in_cgroup",
    "read_cgroups",
    "read_identity",
    "read_start_time",
    "signal_if_same",
    "still_same",
    "terminate_group",
]

_log = logging.getLogger(__name__)

PROC = Path("/proc")

KILL_WAIT_S = 5.0
"""How long :func:`terminate_group` waits for SIGKILLed processes to disappear (the kernel tears down a
large address space or a ptrace stub tree in well under a second; the margin is for a loaded host)."""

POLL_S = 0.05

_START_TIME_FIELD = 22
"""starttime in proc(5)'s numbering of /proc/PID/stat."""
_DEAD_STATES = frozenset("ZXx")
"""Zombie or dead: the process holds nothing any more; it only waits for its parent's wait()."""


@dataclass(frozen=True)
class ProcessIdentity:
    """One process as first seen: pid, start time, and the cgroup it was found in (and must stay in)."""

    pid: int
    start_time: int
    """Field 22 of /proc/PID/stat: clock ticks after boot at which the process started."""
    cgroup: str
    """A cgroup path as /proc/PID/cgroup shows it, e.g. ``/warren/sbx1``; the process counts as in it
    while any hierarchy places it there or below."""


def _stat_fields(pid: int, proc: Path) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (after the parenthesised comm, which may contain spaces)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno in (errno.ESRCH, errno.ENOENT):
            return None
        raise
    _, sep, tail = text.rpartition(")")
    return tail.split() if sep else None


def read_start_time(pid: int, *, proc: Path = PROC) -> int | None:
    """The start time of ``pid`` (clock ticks after boot), or None when there is no such process."""
    fields = _stat_fields(pid, proc)
    index = _START_TIME_FIELD - 3
    if fields is None or len(fields) <= index:
        return None
    try:
        return int(fields[index])
    except ValueError:
        return None


def _is_dead(fields: Sequence[str]) -> bool:
    return not fields or fields[0] in _DEAD_STATES


def read_cgroups(pid: int, *, proc: Path = PROC) -> list[str] | None:
    """The cgroup paths of ``pid``, one per hierarchy line of /proc/PID/cgroup; None if it is gone."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno in (errno.ESRCH, errno.ENOENT):
            return None
        raise
    paths = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths.append(parts[2])
    return paths


def in_cgroup(paths: Iterable[str], cgroup: str) -> bool:
    """Whether one of ``paths`` is ``cgroup`` or lies below it (whole path components only:
    ``/warren-test/x`` is not below ``/warren``)."""
    top = "/" + cgroup.strip("/")
    if top == "/":
        return True
    return any(p == top or p.startswith(top + "/") for p in paths)


def _primary_cgroup(paths: Sequence[str]) -> str:
    """The most specific cgroup a process is in: the first path that is not the root, else ``/``."""
    return next((p for p in paths if p not in ("", "/")), "/")


def read_identity(pid: int, cgroup: str | None = None, *, proc: Path = PROC) -> ProcessIdentity | None:
    """The identity of ``pid`` now; None if it is gone, a zombie, or not in ``cgroup`` (when given).

    Without ``cgroup`` the process's own (first non-root) cgroup is recorded.
    """
    fields = _stat_fields(pid, proc)
    start = read_start_time(pid, proc=proc)
    paths = read_cgroups(pid, proc=proc)
    if fields is None or _is_dead(fields) or start is None or paths is None:
        return None
    if cgroup is None:
        cgroup = _primary_cgroup(paths)
    elif not in_cgroup(paths, cgroup):
        return None
    # Read the start time again: had the pid been reused between the reads, the cgroup would be the
    # new process's, not the one whose start time we keep.
    if read_start_time(pid, proc=proc) != start:
        return None
    return ProcessIdentity(pid, start, "/" + cgroup.strip("/") if cgroup != "/" else "/")


def still_same(identity: ProcessIdentity, *, proc: Path = PROC) -> bool:
    """Whether ``identity.pid`` is still that process, alive (not a zombie) and in its cgroup."""
    fields = _stat_fields(identity.pid, proc)
    if fields is None or _is_dead(fields):
        return False
    if read_start_time(identity.pid, proc=proc) != identity.start_time:
        return False
    paths = read_cgroups(identity.pid, proc=proc)
    if paths is None or not in_cgroup(paths, identity.cgroup):
        return False
    return read_start_time(identity.pid, proc=proc) == identity.start_time


def _pidfd_open(pid: int) -> int | None:
    """A pidfd for ``pid``; None when the kernel has none (pre-5.3): then the check-then-kill window
    of a plain kill(2) remains, narrowed by the re-check right before it."""
    try:
        return os.pidfd_open(pid)
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EPERM):
            return None
        raise


def signal_if_same(identity: ProcessIdentity, sig: int, *, proc: Path = PROC) -> bool:
    """Send ``sig`` to the process only if it still is ``identity``; True if the signal was sent."""
    try:
        pidfd = _pidfd_open(identity.pid)
    except (ProcessLookupError, OSError):
        return False  # gone (ESRCH), or not a process we may see
    try:
        # The pidfd was opened before this check, so it names the process the check looked at (or one
        # that has exited since, for which the kernel refuses the signal).
        if not still_same(identity, proc=proc):
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(identity.pid, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


@dataclass(frozen=True)
class TerminateResult:
    """What :func:`terminate_group` did, by identity."""

    terminated: tuple[ProcessIdentity, ...]
    """Gone: exited within the grace period after SIGTERM (or before anything was sent)."""
    killed: tuple[ProcessIdentity, ...]
    """Still the same process after the grace period: got SIGKILL."""
    spared: tuple[ProcessIdentity, ...]
    """Something runs under the pid but it is no longer the process first seen (pid reused, or it left
    the cgroup) before SIGTERM or before SIGKILL: not signalled from then on."""
    survivors: tuple[ProcessIdentity, ...]
    """SIGKILLed but still the same process when the final wait ended (e.g. stuck in D state)."""


async def _wait_gone(identities: Sequence[ProcessIdentity], within_s: float, proc: Path,
                     poll_s: float) -> list[ProcessIdentity]:
    """Wait up to ``within_s`` until none of ``identities`` is still the same; return those that are."""
    deadline = time.monotonic() + within_s
    pending = [i for i in identities if still_same(i, proc=proc)]
    while pending and time.monotonic() < deadline:
        await asyncio.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        pending = [i for i in pending if still_same(i, proc=proc)]
    return pending


def _alive_anyhow(identity: ProcessIdentity, proc: Path) -> bool:
    """Whether something runs under the pid at all (a reused pid, or the process outside its cgroup)."""
    fields = _stat_fields(identity.pid, proc)
    return fields is not None and not _is_dead(fields)


async def terminate_group(
    identities: Sequence[ProcessIdentity],
    grace_s: float,
    *,
    kill_wait_s: float = KILL_WAIT_S,
    poll_s: float = POLL_S,
    proc: Path = PROC,
) -> TerminateResult:
    """SIGTERM every identity that is still the same, wait up to ``grace_s`` for them to exit, re-check
    each one, SIGKILL only those that are still the same process, and wait up to ``kill_wait_s``."""
    termed = {i for i in identities if signal_if_same(i, signal.SIGTERM, proc=proc)}
    remaining = set(await _wait_gone([i for i in identities if i in termed], grace_s, proc, poll_s))
    killed, spared = [], []
    for identity in identities:
        if identity in remaining and signal_if_same(identity, signal.SIGKILL, proc=proc):
            killed.append(identity)
        elif _alive_anyhow(identity, proc):
            # Something runs under the pid, but not the process first seen (reused pid), or it left
            # its cgroup (the wait above ends for it as if it had exited): never signal it again.
            spared.append(identity)
            _log.warning("pid %d is no longer the process first seen in %s (reused, or moved out); "
                         "not signalling it", identity.pid, identity.cgroup)
    survivors = await _wait_gone(killed, kill_wait_s, proc, poll_s) if killed else []
    for identity in survivors:
        _log.error("pid %d in %s survived SIGKILL for %.1fs", identity.pid, identity.cgroup, kill_wait_s)
    handled = {*killed, *spared}
    return TerminateResult(
        terminated=tuple(i for i in identities if i not in handled),
        killed=tuple(killed),
        spared=tuple(spared),
        survivors=tuple(survivors),
    )


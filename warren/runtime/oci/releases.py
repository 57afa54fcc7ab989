"""Releases that finish after the operation that asked for them has answered.

A gVisor memory pause is done once ``runsc checkpoint`` has written the image: the sandbox's processes
are gone. What is left is cleanup of host resources (``runsc delete``, the overlay mount, cgroups, the
netns and veth), and ``runsc delete`` alone waits until the sandbox process has been reaped, which
can take seconds. :class:`PendingReleases` runs that cleanup in a task the backend owns, so that the
pause can answer first.

Rules (the backend keeps them; see ``OciBackendBase._settle``):

* The sandbox's record says a release is pending (paused with a network still set) until the release
  has saved its record without one; so after a crash, or after a release that failed, the next
  operation on the sandbox finds the work named on disk and finishes it itself.
* Every later operation on that sandbox (resume, snapshot, stop) takes the sandbox lock and then
  :meth:`PendingReleases.wait` before it touches the sandbox.
* A release never raises into the task: a failure is logged (error level, with the sandbox id) and
  left for the next operation to retry, which raises if the retry fails too.
* :meth:`PendingReleases.aclose` (node shutdown) waits for every release; cancelled, it cancels them.

Usage::

    releases = PendingReleases()
    releases.start("sbx1", functools.partial(backend._release, record, paths))
    ...
    await releases.wait("sbx1")   # under the sandbox lock, before touching the sandbox again
    await releases.aclose()       # at shutdown
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["PendingReleases", "ReleaseStatistics"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReleaseStatistics:
    """What :meth:`PendingReleases.statistics` saw."""

    running: int
    """Release tasks not yet ended."""
    waiting: int
    """Callers in :meth:`PendingReleases.wait` for a release that had not ended."""


class PendingReleases:
    """At most one release task per sandbox id, owned here until it ends."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # Invariant: every task in _tasks is not done, or its done callback is about to remove it.
        self._waiting = 0
        self._closed = False

    def statistics(self) -> ReleaseStatistics:
        return ReleaseStatistics(running=len(self._tasks), waiting=self._waiting)

    async def start(self, sandbox_id: str, release: Callable[[], Awaitable[None]]) -> None:
        """Run ``release()`` in a task of its own and return; after :meth:`aclose` it runs (and fails)
        here instead. The caller holds the sandbox lock and has waited for any earlier release."""
        if sandbox_id in self._tasks:
            raise RuntimeError(f"a release of sandbox {sandbox_id} is already running")
        if self._closed:
            await release()
            return
        task = asyncio.create_task(self._run(sandbox_id, release), name=f"release-{sandbox_id}")
        self._tasks[sandbox_id] = task
        task.add_done_callback(lambda done: self._forget(sandbox_id, done))

    async def wait(self, sandbox_id: str) -> None:
        """Until the release of ``sandbox_id`` (if any) has ended. Never raises its failure (logged; the
        record still names the work), and a cancelled caller leaves the release running."""
        task = self._tasks.get(sandbox_id)
        if task is None:
            return
        self._waiting += 1
        try:
            await asyncio.wait([task])
        finally:
            self._waiting -= 1

    async def aclose(self) -> None:
        """Refuse new background releases and wait for the running ones; cancelled, cancel them (the
        records name what is left, finished at the next start by whatever touches the sandbox)."""
        self._closed = True
        tasks = list(self._tasks.values())
        if not tasks:
            return
        try:
            await asyncio.wait(tasks)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            raise

    def _forget(self, sandbox_id: str, done: asyncio.Task[None]) -> None:
        if self._tasks.get(sandbox_id) is done:
            del self._tasks[sandbox_id]

    @staticmethod
    async def _run(sandbox_id: str, release: Callable[[], Awaitable[None]]) -> None:
        try:
            await release()
        except Exception:
            _log.exception("releasing the host resources of paused sandbox %s failed; its next resume, "
                           "snapshot or stop retries", sandbox_id)

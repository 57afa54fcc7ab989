"""Notice at once when a sandbox's init process exits (OOM of a gVisor sandbox, a crash, a kill -9).

One pidfd per running sandbox, registered with the event loop; nothing polls. The callback only
queues the sandbox id; the manager's reaper task decides what the exit means.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

log = logging.getLogger(__name__)


class ExitWatcher:
    def __init__(self) -> None:
        self.exited: asyncio.Queue[str] = asyncio.Queue()
        self._fds: dict[str, int] = {}

    def watch(self, sandbox_id: str, pid: int | None) -> None:
        """Start watching ``pid`` for ``sandbox_id`` (replacing an earlier watch); no-op without a pid."""
        self.unwatch(sandbox_id)
        if pid is None or pid <= 0:
            return
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.exited.put_nowait(sandbox_id)
            return
        except OSError as exc:  # pidfd unsupported: the sandbox is simply not watched
            log.warning("cannot watch sandbox %s (pid %d): %s", sandbox_id, pid, exc)
            return
        self._fds[sandbox_id] = fd
        asyncio.get_running_loop().add_reader(fd, self._fired, sandbox_id, fd)

    def unwatch(self, sandbox_id: str) -> None:
        fd = self._fds.pop(sandbox_id, None)
        if fd is not None:
            with contextlib.suppress(RuntimeError, ValueError):
                asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    def close(self) -> None:
        for sandbox_id in list(self._fds):
            self.unwatch(sandbox_id)

    def _fired(self, sandbox_id: str, fd: int) -> None:
        if self._fds.get(sandbox_id) == fd:
            self.unwatch(sandbox_id)
            self.exited.put_nowait(sandbox_id)

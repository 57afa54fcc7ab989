"""A sandbox's logs: its start command's output and its guest agent's.

The start command runs under the agent with its output streamed to the node for as long as it runs
(:func:`warren.orchestrator.startcmd.run_start_command` hands the stream to :meth:`SandboxLogs.follow`);
each line is kept with the time it arrived, the last ``MAX_LINES`` per sandbox, in memory (a restart of
the node forgets them). The agent writes its own log to its stderr, which the runtime keeps in the
sandbox's ``runtime.log`` on the host; :func:`agent_lines` reads its tail (bounded, never following a
link). Both are served by ``GET /v2/sandboxes/{id}/logs`` in E2B's ``SandboxLogEntry`` shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_LINES = 1000
"""Lines kept per sandbox (E2B's page limit)."""
MAX_LINE = 4096
"""Longer lines are cut (and a partial line is flushed at this length)."""
AGENT_TAIL_BYTES = 256 * 1024
"""How much of the end of ``runtime.log`` is read."""
_LEVELS = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "ERROR": "error", "CRITICAL": "error"}


@dataclass(frozen=True)
class LogLine:
    at: float
    level: str
    """E2B's ``LogLevel``: debug, info, warn, error."""
    source: str
    """``start`` (the start command; stdout or stderr in ``stream``) or ``agent``."""
    stream: str
    text: str


class SandboxLogs:
    """Start-command output of this node's sandboxes, and the tasks that follow it."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lines: dict[str, deque[LogLine]] = {}
        self._partial: dict[tuple[str, str], str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        """Invariant: every follower until it ends; :meth:`aclose` cancels and awaits them."""

    def add(self, sandbox_id: str, stream: str, data: bytes) -> None:
        """Output of the start command: complete lines are kept, the rest waits for its newline."""
        key = (sandbox_id, stream)
        text = self._partial.pop(key, "") + data.decode("utf-8", "replace")
        *complete, rest = text.split("\n")
        while len(rest) >= MAX_LINE:
            complete.append(rest[:MAX_LINE])
            rest = rest[MAX_LINE:]
        if rest:
            self._partial[key] = rest
        for line in complete:
            self._keep(sandbox_id, stream, line)

    def _keep(self, sandbox_id: str, stream: str, line: str) -> None:
        lines = self._lines.setdefault(sandbox_id, deque(maxlen=MAX_LINES))
        level = "error" if stream == "stderr" else "info"
        lines.append(LogLine(self._clock(), level, "start", stream, line.rstrip("\r")[:MAX_LINE]))

    def flush(self, sandbox_id: str) -> None:
        """The stream ended: a last line without a newline is kept too."""
        for key in [k for k in self._partial if k[0] == sandbox_id]:
            self._keep(sandbox_id, key[1], self._partial.pop(key))

    def lines(self, sandbox_id: str) -> list[LogLine]:
        return list(self._lines.get(sandbox_id, ()))

    def prune(self, keep: Iterable[str]) -> None:
        """Drop the lines of sandboxes not in ``keep`` (the node's sandboxes; the rest are gone)."""
        kept = set(keep)
        for sandbox_id in [s for s in self._lines if s not in kept]:
            del self._lines[sandbox_id]
        for key in [k for k in self._partial if k[0] not in kept]:
            del self._partial[key]

    def follow(self, sandbox_id: str, follower: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``follower`` (it feeds :meth:`add`) as a task this object owns until it ends."""

        task = asyncio.create_task(follower, name=f"start-output {sandbox_id}")
        self._tasks.add(task)

        def ended(done: asyncio.Task[None]) -> None:
            self._tasks.discard(done)
            self.flush(sandbox_id)
            if not done.cancelled() and done.exception() is not None:  # a killed or paused sandbox's stream breaks
                log.debug("start command output of %s: %s", sandbox_id, done.exception())

        task.add_done_callback(ended)
        return task

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def agent_lines(path: Path, max_bytes: int = AGENT_TAIL_BYTES) -> list[LogLine]:
    """The tail of the agent's log (``runtime.log``; lines of the runtime CLI too), at most
    ``max_bytes``, read without following a link. Lines carry the file's modification time."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    with contextlib.closing(os.fdopen(fd, "rb")) as fh:
        info = os.fstat(fd)
        start = max(0, info.st_size - max_bytes)
        fh.seek(start)
        data = fh.read(max_bytes)
    lines = data.decode("utf-8", "replace").splitlines()
    if start > 0 and lines:
        lines = lines[1:]  # the first one was cut
    out: list[LogLine] = []
    for line in lines[-MAX_LINES:]:
        if not line.strip():
            continue
        level = "info"
        if line.startswith("warren-guest "):
            word = line.split(" ", 2)[1]
            level = _LEVELS.get(word, "info")
        out.append(LogLine(info.st_mtime, level, "agent", "agent", line[:MAX_LINE]))
    return out


__all__ = ["AGENT_TAIL_BYTES", "MAX_LINES", "LogLine", "SandboxLogs", "agent_lines"]

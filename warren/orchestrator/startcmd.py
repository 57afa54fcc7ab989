"""A template's start command: started when a sandbox is created from it, awaited through its ready command.

E2B runs a template's start command at build time and snapshots the running process; warren starts
it in every new sandbox instead, right after ``/init``: as the template's user, in its workdir and
with its env (the agent's defaults from ``/init``), as a background process that outlives the call.
A runc warm-pool spare runs it when the spare starts, before any create, with the template's env only
(the claiming create's env vars reach the commands the user runs, not this one), as in E2B; gVisor
templates with one are sealed as a memory snapshot taken after it passed its ready command.
When the template has a ready command, creation then polls it (every ``POLL_S``) until it exits 0;
if it does not within the timeout, creation fails with the ready command's last output. Without a
ready command creation returns as soon as the start command runs. Sandboxes made from snapshots
(or forks) carry their processes already and start nothing.
"""

from __future__ import annotations

import asyncio
import time

from ..config import Settings
from ..errors import RuntimeFailure
from ..guestclient import AgentClient, AgentError
from ..runtime.base import SandboxHandle
from .origin import Origin
from .sandboxlogs import SandboxLogs

DEFAULT_READY_TIMEOUT_S = 30.0
POLL_S = 0.2
START_TIMEOUT_S = 30.0
"""How long the agent may take to report that the start command started."""
READY_ATTEMPT_S = 10.0
"""One run of the ready command is killed after this long (it counts as not ready)."""
SHELLS = (("/bin/bash", "-l", "-c"), ("/bin/sh", "-c"))
"""Like ``commands.run``: a login bash, or ``sh`` in images without bash."""


async def _shell_start(agent: AgentClient, command: str) -> tuple[str, ...]:
    """Start ``command`` under the first shell the image has; returns that shell's argv prefix."""
    last: AgentError | None = None
    for shell in SHELLS:
        try:
            await agent.start([*shell, command])
            return shell
        except AgentError as exc:
            if exc.code != "invalid_argument":  # invalid_argument: the shell binary does not exist
                raise
            last = exc
    raise RuntimeFailure(f"no shell to run the start command in: {last}")


async def _follow(
    handle: SandboxHandle, access_token: str | None, argv: list[str], logs: SandboxLogs, sandbox_id: str,
    started: asyncio.Future[int],
) -> None:  # fmt: skip
    """Run ``argv`` to its end, its output into ``logs``; ``started`` gets its pid or why it did not start."""

    def on_start(pid: int) -> None:
        if not started.done():
            started.set_result(pid)

    try:
        async with AgentClient(handle.address, handle.agent_port, access_token=access_token) as agent:
            await agent.run(argv, on_start=on_start, on_output=lambda stream, data: logs.add(sandbox_id, stream, data))
    except Exception as exc:
        if not started.done():
            started.set_exception(exc)
        raise
    finally:
        if not started.done():
            started.cancel()


async def _followed_start(
    handle: SandboxHandle, access_token: str | None, command: str, logs: SandboxLogs, sandbox_id: str
) -> tuple[str, ...]:
    """Like :func:`_shell_start`, with the command's output kept in ``logs`` by a task ``logs`` owns."""
    last: AgentError | None = None
    for shell in SHELLS:
        started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        logs.follow(sandbox_id, _follow(handle, access_token, [*shell, command], logs, sandbox_id, started))
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await asyncio.shield(started)
            return shell
        except AgentError as exc:
            if exc.code != "invalid_argument":
                raise
            last = exc
        except (TimeoutError, asyncio.CancelledError) as exc:
            if not started.cancelled() and not isinstance(exc, TimeoutError):
                raise
            raise AgentError("the agent did not report the start of the start command") from exc
    raise RuntimeFailure(f"no shell to run the start command in: {last}")


async def run_start_command(
    origin: Origin,
    handle: SandboxHandle,
    access_token: str | None,
    *,
    fresh: bool = True,
    settings: Settings | None = None,
    logs: SandboxLogs | None = None,
    sandbox_id: str = "",
) -> None:
    """Start ``origin``'s start command and wait for its ready command; no-op without a start command.

    ``fresh`` is False for sandboxes restored from a snapshot (their processes run already). The
    ready timeout is ``settings.start_ready_timeout_s``. Raises ``RuntimeFailure`` when the command
    cannot start or never becomes ready. With ``logs``, the command's output is kept there under
    ``sandbox_id`` for as long as it runs.
    """
    timeout_s = settings.start_ready_timeout_s if settings is not None else DEFAULT_READY_TIMEOUT_S
    if not fresh or not origin.start_cmd:
        return
    deadline = time.monotonic() + timeout_s
    async with AgentClient(handle.address, handle.agent_port, access_token=access_token) as agent:
        try:
            if logs is None:
                shell = await _shell_start(agent, origin.start_cmd)
            else:
                shell = await _followed_start(handle, access_token, origin.start_cmd, logs, sandbox_id)
        except AgentError as exc:
            raise RuntimeFailure(f"the template's start command could not start: {exc}") from exc
        if not origin.ready_cmd:
            return
        last = "never ran"
        while True:
            remaining = deadline - time.monotonic()
            try:
                attempt_s = max(1.0, min(READY_ATTEMPT_S, remaining))
                result = await agent.run([*shell, origin.ready_cmd], timeout_s=attempt_s)
                if result.ok:
                    return
                tail = result.output_tail(300)
                last = f"exit code {result.exit_code}" + (f": {tail}" if tail else "")
            except AgentError as exc:
                last = str(exc)
            if time.monotonic() + POLL_S >= deadline:
                raise RuntimeFailure(
                    f"the template's ready command {origin.ready_cmd!r} did not succeed within {timeout_s:.0f}s "
                    f"(last: {last})"
                )
            await asyncio.sleep(POLL_S)


__all__ = ["run_start_command"]

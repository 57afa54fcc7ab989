"""A template's start command: started when a sandbox is created from it, awaited through its ready command.

E2B runs a template's start command at build time and snapshots the running process; warren starts
it in every new sandbox instead, right after ``/init``: as the template's user, in its workdir and
with its env (the agent's defaults from ``/init``), as a background process that outlives the call.
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

DEFAULT_READY_TIMEOUT_S = 30.0
POLL_S = 0.2
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


async def run_start_command(
    origin: Origin,
    handle: SandboxHandle,
    access_token: str | None,
    *,
    fresh: bool = True,
    settings: Settings | None = None,
) -> None:
    """Start ``origin``'s start command and wait for its ready command; no-op without a start command.

    ``fresh`` is False for sandboxes restored from a snapshot (their processes run already). The
    ready timeout is ``settings.start_ready_timeout_s``. Raises ``RuntimeFailure`` when the command
    cannot start or never becomes ready.
    """
    timeout_s = settings.start_ready_timeout_s if settings is not None else DEFAULT_READY_TIMEOUT_S
    if not fresh or not origin.start_cmd:
        return
    deadline = time.monotonic() + timeout_s
    async with AgentClient(handle.address, handle.agent_port, access_token=access_token) as agent:
        try:
            shell = await _shell_start(agent, origin.start_cmd)
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

"""The runc / runsc command line for one backend: global flags, and the few verbs warren uses."""

from __future__ import annotations

import json
from pathlib import Path

from warren.runtime.base import RuntimeKind
from warren.runtime.oci.command import RuntimeCommandError, run_command

__all__ = ["CLI_TIMEOUT", "RuntimeCli"]

CLI_TIMEOUT = 30.0
"""Seconds for delete, kill, state, pause, resume."""

_STATUS = {"running": "running", "paused": "paused", "stopped": "stopped", "created": "stopped"}


class RuntimeCli:
    """``runc --root R ...`` or ``runsc --root=R --platform=P --network=sandbox ...``."""

    def __init__(self, kind: RuntimeKind, binary: Path, root: Path, platform: str) -> None:
        self.kind = kind
        self.binary = binary
        self.root = root
        self.platform = platform

    def argv(self, *args: str | Path) -> list[str | Path]:
        if self.kind is RuntimeKind.RUNC:
            flags = ["--root", str(self.root)]
        else:
            flags = [f"--root={self.root}", f"--platform={self.platform}", "--network=sandbox"]
        return [self.binary, *flags, *args]

    async def delete(self, container_id: str) -> None:
        """``delete --force``: kills and forgets the container; a missing one is fine."""
        if not self.root.is_dir():
            return
        if self.kind is RuntimeKind.RUNC:
            # runc's own kill inside `delete --force` sleeps 100 ms; a separate SIGKILL first makes the
            # delete find a dead container and return in ~5 ms. Errors (not running, unknown) are fine.
            await run_command(self.argv("kill", container_id, "KILL"), timeout=CLI_TIMEOUT, check=False)
        result = await run_command(self.argv("delete", "--force", container_id), timeout=CLI_TIMEOUT, check=False)
        if result.returncode != 0 and "not exist" not in result.stderr_text:
            raise RuntimeCommandError(result.argv, f"exit status {result.returncode}",
                                      returncode=result.returncode, stderr=result.stderr_text.strip())

    async def state(self, container_id: str) -> str | None:
        """``running``, ``paused`` or ``stopped`` (``created`` counts as stopped); None if unknown."""
        result = await run_command(self.argv("state", container_id), timeout=CLI_TIMEOUT, check=False)
        if result.returncode != 0:
            return None
        try:
            status = json.loads(result.stdout)["status"]
        except (ValueError, KeyError, TypeError):
            return None
        return _STATUS.get(status)

"""Hands a sandbox's record to its guest agent (the calls themselves: :mod:`warren.guestclient`)."""

from __future__ import annotations

from ..guestclient import init_agent, wait_healthy
from ..store import SandboxRecord

__all__ = ["DEFAULT_USER", "init_agent", "init_sandbox", "wait_healthy"]

DEFAULT_USER = "user"
"""The user commands run as when the template names none (E2B's default)."""


async def init_sandbox(record: SandboxRecord, address: str, port: int, *, previous_token: str | None) -> None:
    """``POST /init`` with what ``record`` says: its image's env under its own env vars, its token,
    its image's user and workdir. ``previous_token``: the token the agent holds now (a memory snapshot's)."""
    await init_agent(
        address,
        port,
        env_vars={**record.image.env, **record.env_vars},
        access_token=record.access_token,
        default_user=record.image.user or DEFAULT_USER,
        default_workdir=record.image.workdir,
        previous_token=previous_token,
    )

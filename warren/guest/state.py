"""The agent's state: one ``Agent`` built by ``main`` and handed to every handler."""

from __future__ import annotations

import asyncio
from _operator import _compare_digest
from typing import TYPE_CHECKING

from .process import ProcessTable
from .users import PREFERRED_DEFAULT_USER, ROOT, Accounts, User

if TYPE_CHECKING:
    from .filesystem import StoredWatcher


class Agent:
    """Everything the agent knows: sandbox env vars, access token, defaults, children, watchers."""

    def __init__(self, loop: asyncio.AbstractEventLoop, accounts: Accounts, *, poll_watch: bool = False) -> None:
        self.loop = loop
        self.accounts = accounts
        self.poll_watch = poll_watch
        """Watch directories by polling instead of inotify (tests; kernels without inotify)."""
        self.env_vars: dict[str, str] = {}
        """Sandbox env vars from /init: applied to every process."""
        self.access_token: str | None = None
        """Once set, every route but /health (and signed /files) needs X-Access-Token equal to it."""
        self.default_user: str | None = None
        self.default_workdir: str | None = None
        self.processes = ProcessTable(loop)
        self.watchers: dict[str, StoredWatcher] = {}
        """CreateWatcher's watchers by id, drained by GetWatcherEvents."""
        self.cpu_sample: tuple[int, int] | None = None
        """(busy, total) jiffies at the previous /metrics call."""

    def default_username(self) -> str:
        """/init's default user, else ``user`` if it exists, else root."""
        if self.default_user:
            return self.default_user
        if self.accounts.exists(PREFERRED_DEFAULT_USER):
            return PREFERRED_DEFAULT_USER
        return ROOT

    def user(self, name: str | None) -> User | None:
        """The named user, or the default user when ``name`` is None; None if unknown."""
        return self.accounts.user(self.default_username() if name is None else name)

    def token_matches(self, presented: str) -> bool:
        """True when no token is set or ``presented`` equals it (constant-time).

        ``hmac.compare_digest`` is this same function, but importing ``hmac`` maps libcrypto
        (~3.5 MiB of RSS) into an agent that otherwise never needs it.
        """
        if self.access_token is None:
            return True
        return _compare_digest(presented.encode(), self.access_token.encode())

    def close(self) -> None:
        """Shutdown: kill children, stop watchers."""
        self.processes.close()
        for watcher in list(self.watchers.values()):
            watcher.close()
        self.watchers.clear()

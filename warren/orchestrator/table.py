"""Every sandbox this node holds, by id: lookups, listing, routes, and teardown.

The one place a sandbox enters (:meth:`SandboxTable.add`) and leaves (:meth:`SandboxTable.discard`)
the node; removal listeners (the proxy cutting open streams) hear of every sandbox that stops being
routable, and the exit watcher follows each running sandbox's init process.
"""

from __future__ import annotations

import base64
import builtins
import logging
import math
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping

from ..errors import InvalidRequestError, NotFoundError
from ..runtime.base import Runtime, RuntimeKind
from ..store import SandboxRecord
from .exits import ExitWatcher
from .requests import ListQuery, Order
from .sandbox import RecordStore, Sandbox
from .states import SandboxState, public_state

log = logging.getLogger(__name__)

_ENDED_KEPT = 4096
"""How many ids of sandboxes that left the table are remembered (so the proxy can say "killed")."""
_HIDDEN = frozenset({SandboxState.CREATING, SandboxState.KILLING})
"""States the API does not show: a create not finished, a sandbox being torn down."""


class SandboxTable:
    def __init__(self, store: RecordStore, runtimes: Mapping[RuntimeKind, Runtime]) -> None:
        self.store = store
        self._runtimes = runtimes
        self._live: dict[str, Sandbox] = {}
        self.exits = ExitWatcher()
        self._removal_listeners: list[Callable[[str], Awaitable[None]]] = []
        self._freed: list[Callable[[], None]] = []
        self._discarded: list[Callable[[SandboxRecord], Awaitable[None]]] = []
        self._ended: OrderedDict[str, None] = OrderedDict()

    # ----- membership ------------------------------------------------------------------------------

    def add(self, record: SandboxRecord) -> Sandbox:
        sandbox = Sandbox(record, self.store)
        self._live[record.id] = sandbox
        return sandbox

    def holds(self, sandbox: Sandbox) -> bool:
        """Whether ``sandbox`` is still the one this node holds under its id (not discarded)."""
        return self._live.get(sandbox.id) is sandbox

    def lookup(self, sandbox_id: str) -> Sandbox | None:
        """Any sandbox under this id, in any state."""
        return self._live.get(sandbox_id)

    def __iter__(self) -> Iterator[Sandbox]:
        return iter(list(self._live.values()))

    def __len__(self) -> int:
        return len(self._live)

    # ----- listeners -------------------------------------------------------------------------------

    def on_removed(self, listener: Callable[[str], Awaitable[None]]) -> None:
        """Await ``listener(sandbox_id)`` whenever a sandbox stops being routable (killed, died, paused)."""
        self._removal_listeners.append(listener)

    def on_discarded(self, listener: Callable[[SandboxRecord], Awaitable[None]]) -> None:
        """Await ``listener(record)`` after a sandbox and its record are gone (what it kept elsewhere may go)."""
        self._discarded.append(listener)

    def on_freed(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` whenever a sandbox left the table (a slot of the cap may be free)."""
        self._freed.append(callback)

    async def unroute(self, sandbox_id: str) -> None:
        """The sandbox stops taking traffic: stop watching its init and tell the listeners."""
        self.exits.unwatch(sandbox_id)
        for listener in self._removal_listeners:
            try:
                await listener(sandbox_id)
            except Exception:
                log.exception("removal listener failed for %s", sandbox_id)

    # ----- queries ---------------------------------------------------------------------------------

    def get(self, sandbox_id: str) -> Sandbox:
        """A sandbox the API may see; ``NotFoundError`` (404) otherwise."""
        sandbox = self._live.get(sandbox_id)
        if sandbox is None or sandbox.state in _HIDDEN:
            raise NotFoundError(f"sandbox {sandbox_id} not found")
        return sandbox

    def route(self, sandbox_id: str) -> tuple[str, SandboxState] | None:
        """The agent address of a sandbox and its state, or None if this node does not know it."""
        sandbox = self._live.get(sandbox_id)
        if sandbox is None or sandbox.record.address is None:
            return None
        return sandbox.record.address, sandbox.state

    def holder_of_token(self, token: str) -> str | None:
        """The id of the sandbox whose envd access token this is, if any (compared in constant time)."""
        for sandbox_id, sandbox in self._live.items():
            held = sandbox.record.access_token
            if held and secrets.compare_digest(held.encode(), token.encode()):
                return sandbox_id
        return None

    def count_in(self, states: frozenset[SandboxState]) -> int:
        return sum(1 for sb in self._live.values() if sb.state in states)

    def running_ids(self) -> builtins.list[str]:
        return [i for i, sb in self._live.items() if sb.state is SandboxState.RUNNING]

    def known_ids(self) -> set[str]:
        return set(self._live)

    def ended(self, sandbox_id: str) -> bool:
        """Whether a sandbox under this id left the table lately (killed, timed out, died)."""
        return sandbox_id in self._ended and sandbox_id not in self._live

    def list(self, query: ListQuery) -> tuple[builtins.list[SandboxRecord], str | None]:
        """Filtered and ordered by start time (newest first unless ``order`` is asc); one page and the
        token of the next one.

        Pages are a keyset over (start time, id): the token is the last entry's key, and the next page
        starts strictly after it in the query's order. A sandbox created between two pages sorts before
        the token (desc) or after every entry so far (asc), so no entry is skipped or repeated.
        """
        out = sorted(
            (sb.record for sb in self._live.values() if sb.state not in _HIDDEN and _matches(sb.record, query)),
            key=_key,
            reverse=query.order is Order.DESC,
        )
        if query.next_token:
            after = _decode_token(query.next_token)
            if query.order is Order.DESC:
                out = [r for r in out if _key(r) < after]
            else:
                out = [r for r in out if _key(r) > after]
        if query.limit is not None and len(out) > query.limit:
            page = out[: query.limit]
            return page, _encode_token(page[-1])
        return out, None

    # ----- teardown --------------------------------------------------------------------------------

    async def discard(self, sandbox: Sandbox | SandboxRecord) -> None:
        """Remove a sandbox and everything it owns; safe on any half-made sandbox."""
        record = sandbox.record if isinstance(sandbox, Sandbox) else sandbox
        runtime = self._runtimes.get(RuntimeKind(record.runtime))
        await self.unroute(record.id)
        try:
            if runtime is not None:
                await runtime.stop(record.id)
        finally:
            self._live.pop(record.id, None)
            self._ended[record.id] = None
            self._ended.move_to_end(record.id)
            while len(self._ended) > _ENDED_KEPT:
                self._ended.popitem(last=False)
            for callback in self._freed:
                callback()
            await self.store.delete(record.id)
            for listener in self._discarded:
                try:
                    await listener(record)
                except Exception:
                    log.exception("discard listener failed for %s", record.id)


def _key(record: SandboxRecord) -> tuple[float, str]:
    return record.started_at, record.id


def _matches(record: SandboxRecord, query: ListQuery) -> bool:
    return (
        public_state(SandboxState(record.state)) in query.states
        and all(record.metadata.get(k) == v for k, v in query.metadata.items())
        and (query.started_after is None or _micros(record.started_at) >= round(query.started_after * 1_000_000))
        and (query.template is None or query.template in (record.template_id, record.alias))
    )


def _micros(ts: float) -> int:
    """Microseconds, truncated as the API shows times (``startedAt``)."""
    return math.floor(ts * 1_000_000)


def _encode_token(record: SandboxRecord) -> str:
    return encode_list_token(record.started_at, record.id)


def encode_list_token(started_at: float, sandbox_id: str) -> str:
    """The ``nextToken`` of a list page that ends at (``started_at``, ``sandbox_id``): the next page
    has what sorts after it. A gateway sends it to every node (the order is the same on all)."""
    return base64.urlsafe_b64encode(f"{started_at!r}:{sandbox_id}".encode()).decode()


def _decode_token(token: str) -> tuple[float, str]:
    try:
        started, _, sandbox_id = base64.urlsafe_b64decode(token.encode()).decode().partition(":")
        return float(started), sandbox_id
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequestError("invalid nextToken") from None

"""The cluster's shared state in Redis: membership, rosters, bindings, capacity reservations, and the node
each template built through a gateway is on.

Every Redis failure leaves this module as :class:`~warren.errors.UnavailableError` (503): the gateways
and the node's heartbeat treat Redis being away as a passing condition and try again. Each is counted
here, once, through ``on_error(operation)`` (the ``warren_redis_errors_total`` counter of the process).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..errors import UnavailableError
from . import scripts
from .records import NodeInfo, NodeView

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "warren:"


class Reserved:
    """A slot held on a node for one create, until the node's heartbeat counts the sandbox."""

    def __init__(self, node_id: str, token: str) -> None:
        self.node_id = node_id
        self.token = token


ErrorCounter = Callable[[str], None]
"""``on_error(operation)``: one Redis call failed (``heartbeat``, ``reserve``, ``list_nodes``, ``ping``...)."""


def _no_count(operation: str) -> None:
    pass


class ClusterStore:
    def __init__(
        self, client: aioredis.Redis, prefix: str = DEFAULT_PREFIX, on_error: ErrorCounter = _no_count
    ) -> None:
        self._r = client
        self._p = prefix
        self._on_error = on_error
        self._heartbeat = client.register_script(scripts.HEARTBEAT)
        self._reserve = client.register_script(scripts.RESERVE)
        self._commit = client.register_script(scripts.COMMIT)
        self._unbind = client.register_script(scripts.UNBIND)
        self._bind = client.register_script(scripts.BIND)
        self._end_move = client.register_script(scripts.END_MOVE)

    @classmethod
    def connect(
        cls, url: str, prefix: str = DEFAULT_PREFIX, timeout_s: float = 2.0, on_error: ErrorCounter = _no_count
    ) -> ClusterStore:
        """A store on a Redis URL (``redis://host:port/db``); connects lazily, reconnects by itself."""
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.02), 2),
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
            decode_responses=True,
        )
        return cls(client, prefix, on_error)

    @contextlib.asynccontextmanager
    async def _errors(self, what: str) -> AsyncIterator[None]:
        """The one place a Redis error becomes an ``UnavailableError``, and is counted."""
        try:
            yield
        except RedisError as exc:
            self._on_error(what.replace(" ", "_"))
            raise UnavailableError(f"the cluster store (Redis) is unavailable ({what}): {exc}") from exc

    async def aclose(self) -> None:
        await self._r.aclose()

    def _node_keys(self, node_id: str) -> tuple[str, str, str, str, str]:
        base = f"{self._p}node:{node_id}"
        return base, f"{base}:alive", f"{base}:roster", f"{base}:resv", f"{base}:resv-sid"

    def _drain_key(self, node_id: str) -> str:
        return f"{self._p}node:{node_id}:drain"

    def _bound_key(self, node_id: str) -> str:
        return f"{self._p}node:{node_id}:bound"

    # ----- node side ---------------------------------------------------------------------------------

    async def heartbeat(self, info: NodeInfo, roster: Mapping[str, str], *, ttl_s: float, grace_s: float) -> None:
        """Register or refresh ``info`` for ``ttl_s``; replace the node's roster and bind its sandboxes."""
        node, alive, roster_key, resv, resv_sid = self._node_keys(info.node_id)
        args: list[Any] = [
            info.node_id, int(ttl_s * 1000), info.to_json(), info.max_sandboxes, info.active,
            "1" if info.draining else "0", int(grace_s * 1000),
        ]  # fmt: skip
        for sandbox_id, state in roster.items():
            args += [sandbox_id, state]
        keys = [f"{self._p}nodes", node, alive, roster_key, resv, resv_sid, f"{self._p}bindings",
                self._bound_key(info.node_id)]  # fmt: skip
        async with self._errors("heartbeat"):
            await self._heartbeat(keys=keys, args=args)

    async def leave(self, node_id: str) -> None:
        """The node stops (gracefully): it is no longer live; its record and roster stay for its return."""
        async with self._errors("leave"):
            await self._r.delete(self._node_keys(node_id)[1])

    # ----- gateway side ------------------------------------------------------------------------------

    async def nodes(self) -> list[NodeView]:
        """Every node ever registered, live or dead, with the reservations held on it."""
        async with self._errors("list nodes"):
            ids = sorted(str(i) for i in await self._r.smembers(f"{self._p}nodes"))
            if not ids:
                return []
            pipe = self._r.pipeline(transaction=False)
            for node_id in ids:
                node, alive, _, resv, _ = self._node_keys(node_id)
                pipe.hget(node, "info")
                pipe.exists(alive)
                pipe.zcard(resv)
                pipe.exists(self._drain_key(node_id))
                pipe.hlen(self._node_keys(node_id)[2])
            raw = await pipe.execute()
        views = []
        for i, node_id in enumerate(ids):
            info_json, alive_n, reserved, drained, listed = raw[5 * i : 5 * i + 5]
            if info_json is None:
                continue
            try:
                info = NodeInfo.from_json(info_json)
            except Exception as exc:
                log.warning("skipping node %s: %s", node_id, exc)
                continue
            views.append(NodeView(info, bool(alive_n), int(reserved), bool(drained), int(listed)))
        return views

    async def node(self, node_id: str) -> NodeView | None:
        return next((v for v in await self.nodes() if v.node_id == node_id), None)

    async def roster(self, node_id: str) -> dict[str, str]:
        """The node's sandboxes (id -> ``running``/``paused``) at its last heartbeat."""
        async with self._errors("roster"):
            raw = await self._r.hgetall(self._node_keys(node_id)[2])
        return {str(k): str(v) for k, v in raw.items()}

    async def binding(self, sandbox_id: str) -> str | None:
        """The node that has ``sandbox_id``, or None."""
        async with self._errors("lookup"):
            found = await self._r.hget(f"{self._p}bindings", sandbox_id)
        return str(found) if found is not None else None

    async def bind(self, sandbox_id: str, node_id: str) -> None:
        """A sandbox made on ``node_id`` outside a create (a fork child): bound, and running in its roster."""
        keys = [f"{self._p}bindings", self._node_keys(node_id)[2], self._bound_key(node_id)]
        async with self._errors("bind"):
            await self._bind(keys=keys, args=[sandbox_id, node_id])

    async def unbind(self, sandbox_id: str, node_id: str) -> None:
        """Forget the binding if it still names ``node_id``; drop the sandbox from that node's roster."""
        async with self._errors("unbind"):
            await self._unbind(keys=[f"{self._p}bindings"], args=[sandbox_id, node_id])
            await self._r.hdel(self._node_keys(node_id)[2], sandbox_id)
            await self._r.zrem(self._bound_key(node_id), sandbox_id)

    async def bindings(self, sandbox_ids: list[str]) -> dict[str, str | None]:
        """The node each of ``sandbox_ids`` is bound to (None: none)."""
        if not sandbox_ids:
            return {}
        async with self._errors("lookup"):
            found = await self._r.hmget(f"{self._p}bindings", sandbox_ids)
        return {sid: (str(n) if n is not None else None) for sid, n in zip(sandbox_ids, found, strict=True)}

    async def claim_move(self, sandbox_id: str, *, hold_s: float) -> str | None:
        """Take the right to move ``sandbox_id`` to another node (one gateway at a time); a token to give
        back with :meth:`end_move`, or None when another gateway is moving it now."""
        token = secrets.token_hex(8)
        async with self._errors("claim move"):
            won = await self._r.set(f"{self._p}moving:{sandbox_id}", token, nx=True, px=int(hold_s * 1000))
        return token if won else None

    async def end_move(self, sandbox_id: str, token: str) -> None:
        async with self._errors("end move"):
            await self._end_move(keys=[f"{self._p}moving:{sandbox_id}"], args=[token])

    async def drained(self, node_id: str) -> bool:
        """Whether an admin drained ``node_id`` (``POST /nodes/{id}`` through a gateway)."""
        async with self._errors("drain"):
            return bool(await self._r.exists(self._drain_key(node_id)))

    async def reserve(self, node_id: str, *, hold_s: float) -> Reserved | str:
        """Take a slot on ``node_id`` atomically; the reason (``full``, ``dead``, ``draining``) when not."""
        token = secrets.token_hex(8)
        node, alive, _, resv, _ = self._node_keys(node_id)
        async with self._errors("reserve"):
            keys = [alive, node, resv, self._drain_key(node_id)]
            result = int(await self._reserve(keys=keys, args=[token, int(hold_s * 1000)]))
        if result == 1:
            return Reserved(node_id, token)
        return {0: "full", -1: "dead", -2: "draining"}.get(result, "unknown")

    async def commit(self, reserved: Reserved, sandbox_id: str, *, hold_s: float) -> None:
        """The create succeeded: bind the sandbox; the slot stays held until the node's heartbeat has it."""
        _, _, roster, resv, resv_sid = self._node_keys(reserved.node_id)
        async with self._errors("commit"):
            await self._commit(
                keys=[resv, resv_sid, f"{self._p}bindings", roster, self._bound_key(reserved.node_id)],
                args=[reserved.token, sandbox_id, reserved.node_id, int(hold_s * 1000)],
            )

    async def release(self, reserved: Reserved) -> None:
        """The create failed: give the slot back."""
        _, _, _, resv, resv_sid = self._node_keys(reserved.node_id)
        async with self._errors("release"):
            pipe = self._r.pipeline(transaction=True)
            pipe.zrem(resv, reserved.token)
            pipe.hdel(resv_sid, reserved.token)
            await pipe.execute()

    async def set_template_node(self, refs: Iterable[str], node_id: str) -> None:
        """A template (by each of ``refs``: its id and name) is built on ``node_id``: every later call of its
        builds (uploads, start, status, tags) goes there, and creates find it before a heartbeat lists it."""
        items = [x for ref in dict.fromkeys(refs) if ref for x in (ref, node_id)]
        if not items:
            return
        async with self._errors("template node"):
            await self._r.hset(f"{self._p}template-nodes", items=items)

    async def template_node(self, ref: str) -> str | None:
        """The node a build through a gateway put template ``ref`` (id or name) on, or None."""
        async with self._errors("template node"):
            found = await self._r.hget(f"{self._p}template-nodes", ref)
        return str(found) if found is not None else None

    async def forget_template(self, refs: Iterable[str], node_id: str) -> None:
        """The template was deleted on ``node_id``: its refs that still name that node are forgotten."""
        async with self._errors("template node"):
            for ref in refs:
                await self._unbind(keys=[f"{self._p}template-nodes"], args=[ref, node_id])

    async def set_drain(self, node_id: str, drain: bool) -> None:
        """An admin's drain: no create is placed on the node until it is lifted (the node keeps serving)."""
        async with self._errors("drain"):
            if drain:
                await self._r.set(self._drain_key(node_id), "1")
            else:
                await self._r.delete(self._drain_key(node_id))

    async def ping(self) -> bool:
        try:
            return bool(await self._r.ping())
        except RedisError:
            self._on_error("ping")
            return False

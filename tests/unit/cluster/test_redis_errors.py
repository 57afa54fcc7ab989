"""Every failed Redis call leaves the cluster store as an UnavailableError and is counted once, by
operation, through ``on_error`` (the ``warren_redis_errors_total`` counter of nodes and gateways)."""

from __future__ import annotations

import socket
from collections import Counter

import pytest

from warren.cluster.store import ClusterStore
from warren.errors import UnavailableError


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once it is closed


async def test_each_failed_call_is_counted_by_operation() -> None:
    seen: Counter[str] = Counter()
    url = f"redis://127.0.0.1:{closed_port()}/0"
    store = ClusterStore.connect(url, timeout_s=0.5, on_error=lambda op: seen.update([op]))
    try:
        with pytest.raises(UnavailableError):
            await store.binding("sbx")
        with pytest.raises(UnavailableError):
            await store.nodes()
        with pytest.raises(UnavailableError):
            await store.set_drain("n1", True)
        assert await store.ping() is False
    finally:
        await store.aclose()
    assert dict(seen) == {"lookup": 1, "list_nodes": 1, "drain": 1, "ping": 1}

"""In-memory pool of /30 address slots for sandbox veth pairs.

Slot ``i`` of the pool CIDR is the /30 at offset ``4*i``: the host end of the veth gets ``.4i+1``
and the sandbox ``.4i+2``. So in 10.77.0.0/16, slot 0 is 10.77.0.1 <-> 10.77.0.2 and slot 64 is
10.77.1.1 <-> 10.77.1.2. Allocation walks round-robin from the last slot handed out, so a slot that was
just released is the last to be reused (stale conntrack entries and ARP caches age out meanwhile).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from warren.errors import UnavailableError

__all__ = ["AddressPool", "Slot"]

SLOT_PREFIXLEN = 30


@dataclass(frozen=True)
class Slot:
    """One /30: the host and sandbox ends of a veth pair."""

    index: int
    host_ip: str
    guest_ip: str
    prefixlen: int = SLOT_PREFIXLEN


class AddressPool:
    """Hands out /30 slots of ``cidr``. Not thread-safe; use it from one event loop."""

    def __init__(self, cidr: str) -> None:
        self.network = ipaddress.IPv4Network(cidr)
        if self.network.prefixlen > SLOT_PREFIXLEN:
            raise ValueError(f"pool {cidr} is smaller than one /{SLOT_PREFIXLEN}")
        self.size = self.network.num_addresses // 4
        self._used: set[int] = set()
        self._cursor = 0
        # Invariant: every index in _used is in range(size) and was returned by allocate() or reserve().

    def slot(self, index: int) -> Slot:
        """The addresses of slot ``index`` (whether in use or not)."""
        if not 0 <= index < self.size:
            raise ValueError(f"slot {index} outside pool {self.network}")
        base = int(self.network.network_address) + 4 * index
        return Slot(index, str(ipaddress.IPv4Address(base + 1)), str(ipaddress.IPv4Address(base + 2)))

    def allocate(self, busy: Callable[[int], bool] = lambda _index: False) -> Slot:
        """Take the next free slot; ``busy(index)`` vetoes slots that are still in use on the host.

        Raises ``UnavailableError`` when every slot is taken.
        """
        for step in range(self.size):
            index = (self._cursor + step) % self.size
            if index in self._used or busy(index):
                continue
            self._used.add(index)
            self._cursor = (index + 1) % self.size
            return self.slot(index)
        raise UnavailableError(f"address pool {self.network} is exhausted ({self.size} slots)")

    def reserve(self, index: int) -> Slot:
        """Mark a slot as taken (re-adopting a sandbox that survived a restart)."""
        slot = self.slot(index)
        self._used.add(index)
        return slot

    def release(self, index: int) -> None:
        """Give a slot back. Releasing a free slot is a no-op."""
        self._used.discard(index)

    @property
    def in_use(self) -> int:
        return len(self._used)

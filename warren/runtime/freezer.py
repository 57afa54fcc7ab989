"""Freezing and thawing a runc container's cgroup directly, as ``runc pause`` / ``runc resume`` do.

``runc pause`` is one write to the cgroup freezer, but it costs a Go process start and a read of the
container's state: 8-13 ms on this class of host, against well under a millisecond for the write.
runc keeps no state of its own about a pause: ``runc state`` and ``runc resume`` read the freezer, so
a container frozen here is "paused" to runc, and the CLI still works on it (and is the fallback when
the freezer cannot be found).

cgroup v1: ``freezer.state`` <- ``FROZEN`` / ``THAWED``; it reads ``FREEZING`` until every task, in
nested cgroups too, is frozen. A task in an uninterruptible sleep can hold that up, so, like runc, the
write is repeated after a short thaw now and then. cgroup v2: ``cgroup.freeze`` <- ``1`` / ``0``; the
``frozen`` key of ``cgroup.events`` says when it is done.

The functions block (bounded by ``timeout_s``); callers run them in a worker thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from warren.runtime.cgroups import CgroupHierarchies

__all__ = ["Freezer", "FreezerError", "freezer_of"]

_RETOGGLE_S = 0.25
"""While a v1 freeze is still FREEZING after this long, thaw and freeze again (runc does the same)."""


class FreezerError(OSError):
    """The freezer did not reach the state asked for in time (the cgroup is left thawed)."""


@dataclass(frozen=True)
class Freezer:
    """The freezer of one cgroup."""

    directory: Path
    v1: bool

    def freeze(self, timeout_s: float = 5.0) -> None:
        """Freeze every task of the cgroup and its children; thawed again and raises on timeout."""
        try:
            self._set(frozen=True, timeout_s=timeout_s)
        except OSError:
            try:
                self._set(frozen=False, timeout_s=timeout_s)
            except OSError:
                pass
            raise

    def thaw(self, timeout_s: float = 5.0) -> None:
        self._set(frozen=False, timeout_s=timeout_s)

    def frozen(self) -> bool:
        if self.v1:
            return self._read("freezer.state") == "FROZEN"
        return _events_frozen(self._read("cgroup.events"))

    def _set(self, *, frozen: bool, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        toggled = time.monotonic()
        self._write(frozen)
        delay = 0.0001
        while not self._done(frozen):
            now = time.monotonic()
            if now >= deadline:
                want = "frozen" if frozen else "thawed"
                raise FreezerError(f"cgroup {self.directory} not {want} after {timeout_s:.1f} s")
            if frozen and self.v1 and now - toggled >= _RETOGGLE_S:
                self._write(False)
                self._write(True)
                toggled = now
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def _done(self, frozen: bool) -> bool:
        if self.v1:
            return self._read("freezer.state") == ("FROZEN" if frozen else "THAWED")
        return _events_frozen(self._read("cgroup.events")) is frozen

    def _write(self, frozen: bool) -> None:
        if self.v1:
            (self.directory / "freezer.state").write_text("FROZEN" if frozen else "THAWED")
        else:
            (self.directory / "cgroup.freeze").write_text("1" if frozen else "0")

    def _read(self, name: str) -> str:
        return (self.directory / name).read_text().strip()


def _events_frozen(events: str) -> bool:
    for line in events.splitlines():
        key, _, value = line.partition(" ")
        if key == "frozen":
            return value.strip() == "1"
    return False


def freezer_of(hierarchies: CgroupHierarchies, rel: str) -> Freezer | None:
    """The freezer runc uses for cgroup ``rel``: v1's ``freezer`` controller when mounted (hybrid hosts
    included), else v2's; None when the cgroup does not exist there."""
    rel = rel.strip("/")
    if "freezer" in hierarchies.v1:
        directory = hierarchies.v1["freezer"] / rel
        return Freezer(directory, v1=True) if (directory / "freezer.state").is_file() else None
    if hierarchies.v2 is not None:
        directory = hierarchies.v2 / rel
        return Freezer(directory, v1=False) if (directory / "cgroup.freeze").is_file() else None
    return None

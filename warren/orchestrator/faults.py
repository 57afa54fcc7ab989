"""A test seam: points in a transition where an end-to-end test may stop the node.

Production passes :data:`NO_FAULTS`. The crash tests (``tests/e2e/test_crash_transitions.py``) start a
node with ``WARREN_TEST_STALL=pause|resume``; only then does the node (``warren.node``) build a
:class:`StallAt`, which stops the transition forever at that point so the test can SIGKILL the node
mid-transition and check what the next start settles.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import Protocol

log = logging.getLogger(__name__)

STALL_ENV = "WARREN_TEST_STALL"


class FaultPoint(enum.StrEnum):
    PAUSE = "pause"  # the runtime paused; the record still says pausing
    RESUME = "resume"  # the runtime resumed; the record still says resuming


class Faults(Protocol):
    async def reached(self, point: FaultPoint) -> None:
        """Called at ``point``; returns at once unless a test asked to stop there."""
        ...


class _NoFaults:
    async def reached(self, point: FaultPoint) -> None:
        return None


NO_FAULTS: Faults = _NoFaults()


class StallAt:
    """Stops forever at one point (a test seam; never built unless :data:`STALL_ENV` is set). Its log
    line ("test hook: stalling") is what the crash tests wait for."""

    def __init__(self, point: FaultPoint) -> None:
        self.point = point

    async def reached(self, point: FaultPoint) -> None:
        if point is self.point:
            log.warning("test hook: stalling at %s (%s is set)", point.value, STALL_ENV)
            await asyncio.Event().wait()


def faults_from_env(environ: dict[str, str] | None = None) -> Faults:
    import os

    value = (environ if environ is not None else os.environ).get(STALL_ENV)
    return StallAt(FaultPoint(value)) if value else NO_FAULTS

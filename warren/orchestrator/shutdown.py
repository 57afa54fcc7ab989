"""Graceful node shutdown (seed 000, with its review's fixes): preserve every running sandbox.

Order: refuse new lifecycle operations (503) → pause every running sandbox with bounded concurrency
(each pause takes that sandbox's lock, so in-flight transitions finish first) → retry the failures,
up to ``passes`` passes in all → report. Time grows with ``ceil(n / concurrency)``, not with ``n``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from ..errors import ConflictError, NotFoundError, WarrenError
from .manager import SandboxManager

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 8
DEFAULT_PASSES = 3


@dataclass
class ShutdownReport:
    paused: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    passes: int = 0


async def preserve_all(
    manager: SandboxManager, *, concurrency: int = DEFAULT_CONCURRENCY, passes: int = DEFAULT_PASSES
) -> ShutdownReport:
    """Pause every running sandbox; returns which were paused and which failed after all passes."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    manager.begin_drain()
    report = ShutdownReport()
    gate = asyncio.Semaphore(concurrency)

    async def pause_one(sandbox_id: str) -> None:
        async with gate:
            try:
                await manager.pause(sandbox_id)
            except (NotFoundError, ConflictError):
                return  # killed, expired or paused meanwhile: nothing to preserve
            except WarrenError as exc:
                report.failed[sandbox_id] = str(exc)
                log.warning("shutdown: pausing %s failed: %s", sandbox_id, exc)
                return
            report.failed.pop(sandbox_id, None)
            report.paused.append(sandbox_id)

    for _ in range(passes):
        pending = manager.running_ids()
        if not pending:
            break
        report.passes += 1
        async with asyncio.TaskGroup() as group:
            for sandbox_id in pending:
                group.create_task(pause_one(sandbox_id), name=f"shutdown-pause-{sandbox_id}")
    if report.failed:
        log.error("shutdown: %d sandboxes could not be paused: %s", len(report.failed), report.failed)
    log.info("shutdown: %d sandboxes paused in %d passes", len(report.paused), report.passes)
    return report

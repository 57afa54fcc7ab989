"""Domain-free asyncio helpers. The only place outside TaskGroups where tasks are spawned."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


async def race(*coros: Coroutine[Any, Any, None], names: tuple[str, ...] = ()) -> None:
    """Run coroutines side by side until the first one finishes; cancel and await the others.

    The first one's exception, if any, propagates; the cancelled ones' outcomes are awaited so
    nothing is left running.
    """
    tasks = [
        asyncio.create_task(c, name=names[i] if i < len(names) else None) for i, c in enumerate(coros)
    ]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        if not task.cancelled() and (exc := task.exception()) is not None:
            raise exc


async def wait_event_or_task(event: asyncio.Event, task: asyncio.Task[Any]) -> None:
    """Return once ``event`` is set or ``task`` is done, whichever comes first; ``task`` keeps running."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


__all__ = ["race", "wait_event_or_task"]

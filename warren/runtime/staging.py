"""The default ``stage`` for the :class:`~.prewarm.Prewarmer`: every asset of a runtime in the cache.

``RuntimeStager(cache)`` is itself the ``stage`` callable (returns None); :meth:`RuntimeStager.stage`
returns the staged paths by asset name, which is what the node passes to a runtime before create or
resume. After a successful prewarm, ``stage`` is a handful of existence checks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from warren.errors import HostError

from .assets import AssetCache
from .records import RuntimeRecord


class RuntimeStager:
    """Stages runtimes into an :class:`~.assets.AssetCache`."""

    def __init__(self, cache: AssetCache) -> None:
        self._cache = cache

    async def __call__(self, record: RuntimeRecord) -> None:
        await self.stage(record)

    async def stage(self, record: RuntimeRecord) -> Mapping[str, Path]:
        """Fetch (or find) every asset of ``record``, concurrently; return asset name → cached file."""
        try:
            async with asyncio.TaskGroup() as group:
                tasks = {name: group.create_task(self._cache.fetch(asset)) for name, asset in record.assets.items()}
        except ExceptionGroup as failures:
            errors = failures.exceptions
            if len(errors) == 1:
                raise errors[0] from None
            detail = "; ".join(str(e) for e in errors)
            raise HostError(f"staging runtime {record.hash()}: {len(errors)} assets failed: {detail}") from failures
        paths = {name: task.result() for name, task in tasks.items()}
        for name, path in paths.items():
            if not path.is_file():
                raise HostError(f"staging runtime {record.hash()}: asset {name} vanished from {path}")
        return MappingProxyType(paths)


__all__ = ["RuntimeStager"]

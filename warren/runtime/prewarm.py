"""Prewarm the node's default runtimes in the background, and stage any runtime on demand.

The :class:`Prewarmer` keeps a queue keyed by runtime hash. Its :meth:`~Prewarmer.run` (a
long-lived coroutine the node awaits in its TaskGroup) takes one hash at a time: a hash already
staged is skipped, a hash the index does not know is dropped with an error log, and otherwise the
``stage`` callable runs, bounded by ``attempt_timeout_s`` (an attempt that overruns is cancelled
and counts as a failure). A failed hash is queued again after exponential backoff, up to
``attempts`` attempts in all; then it is forgotten (state ``"failed"``) until something enqueues it
again, which starts over.

Prewarming is only a head start and never blocks serving: :meth:`~Prewarmer.ensure_staged` runs the
same ``stage`` on demand, sharing an attempt already in flight for that hash (prewarm or another
caller) instead of starting a second one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Literal

from warren.errors import HostError, WarrenError

from .index import RuntimeIndex, RuntimeMissError
from .records import RuntimeConfig, RuntimeRecord, validate_runtime_configs

log = logging.getLogger("warren.runtime.prewarm")

PrewarmState = Literal["pending", "prewarming", "ready", "failed"]
StageFn = Callable[[RuntimeRecord], Awaitable[None]]


class StagingTimeout(HostError):
    """Staging a runtime took longer than the attempt bound and was abandoned."""


class _OwnerGone(Exception):
    """The attempt others waited on was cancelled; one of the waiters takes over."""


class Prewarmer:
    """A single-worker, hash-keyed prewarm queue plus the on-demand staging path that shares it."""

    def __init__(
        self,
        index: RuntimeIndex,
        stage: StageFn,
        *,
        attempts: int = 8,
        base_backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        attempt_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self._index = index
        self._stage = stage
        self._attempts = attempts
        self._base_backoff_s = base_backoff_s
        self._max_backoff_s = max_backoff_s
        self._attempt_timeout_s = attempt_timeout_s
        self._clock = clock
        self._sleep = sleep
        self._ready: set[str] = set()
        self._failed: set[str] = set()
        self._jobs: dict[str, int] = {}  # hash → failed attempts so far, while the prewarmer owns it
        self._runnable: dict[str, None] = {}  # insertion-ordered: due for an attempt now
        self._wakeup = asyncio.Event()
        self._inflight: dict[str, asyncio.Future[None]] = {}
        self._running = False

    # -- queue ---------------------------------------------------------------------------------

    def enqueue(self, runtime_hash: str) -> None:
        """Queue ``runtime_hash`` for prewarming; a no-op if it is ready, queued, or being prewarmed."""
        if runtime_hash in self._ready or runtime_hash in self._jobs:
            return
        self._failed.discard(runtime_hash)
        self._jobs[runtime_hash] = 0
        self._push(runtime_hash)

    def on_config(self, configs: Iterable[RuntimeConfig]) -> None:
        """Enqueue the default runtime of each class (after :func:`~.index.register_configs`)."""
        for config in validate_runtime_configs(list(configs)).values():
            self.enqueue(config.record.hash())

    def state(self, runtime_hash: str) -> PrewarmState | None:
        """What to advertise for ``runtime_hash``: None if the prewarmer never saw it."""
        if runtime_hash in self._ready:
            return "ready"
        if runtime_hash in self._inflight:
            return "prewarming"
        if runtime_hash in self._jobs:
            return "pending"
        if runtime_hash in self._failed:
            return "failed"
        return None

    async def run(self) -> None:
        """Work the queue until cancelled. Await it in the node's TaskGroup; run it once."""
        if self._running:
            raise RuntimeError("Prewarmer.run() is already running")
        self._running = True
        try:
            async with asyncio.TaskGroup() as backoffs:
                while True:
                    runtime_hash = await self._next()
                    await self._prewarm(runtime_hash, backoffs)
        finally:
            self._running = False

    # -- on demand -----------------------------------------------------------------------------

    async def ensure_staged(self, runtime_hash: str) -> None:
        """Make sure ``runtime_hash`` is staged before a sandbox uses it.

        Returns at once if it is ready; joins an attempt in flight; otherwise stages it now (bounded
        like a prewarm attempt). Raises :class:`~.index.RuntimeMissError` (409) for a hash the index
        does not know, and the attempt's error (a :class:`~warren.errors.HostError`) if it fails.
        """
        if runtime_hash in self._ready:
            return
        record = self._index.resolve(runtime_hash)
        await self._attempt(runtime_hash, record)

    # -- internals -----------------------------------------------------------------------------

    def _push(self, runtime_hash: str) -> None:
        self._runnable[runtime_hash] = None
        self._wakeup.set()

    async def _next(self) -> str:
        while not self._runnable:
            self._wakeup.clear()
            await self._wakeup.wait()
        runtime_hash = next(iter(self._runnable))
        del self._runnable[runtime_hash]
        return runtime_hash

    async def _prewarm(self, runtime_hash: str, backoffs: asyncio.TaskGroup) -> None:
        if runtime_hash not in self._jobs:
            return  # not ours any more
        if runtime_hash in self._ready:
            del self._jobs[runtime_hash]
            return
        try:
            record = self._index.resolve(runtime_hash)
        except RuntimeMissError:
            log.error("prewarm: runtime %s is not in the runtime index; dropped", runtime_hash)
            del self._jobs[runtime_hash]
            return
        started = self._clock()
        try:
            await self._attempt(runtime_hash, record)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failures = self._jobs[runtime_hash] + 1
            if failures >= self._attempts:
                del self._jobs[runtime_hash]
                self._failed.add(runtime_hash)
                log.error(
                    "prewarm: runtime %s failed %d times, giving up until it is enqueued again: %s",
                    runtime_hash,
                    failures,
                    exc,
                )
                return
            self._jobs[runtime_hash] = failures
            delay = min(self._max_backoff_s, self._base_backoff_s * 2 ** (failures - 1))
            log.warning(
                "prewarm: runtime %s attempt %d/%d failed (%s); retrying in %.1fs",
                runtime_hash,
                failures,
                self._attempts,
                exc,
                delay,
            )
            backoffs.create_task(self._retry_after(runtime_hash, delay), name=f"prewarm-backoff-{runtime_hash[:12]}")
            return
        self._jobs.pop(runtime_hash, None)
        log.info("prewarm: runtime %s ready in %.1fs", runtime_hash, self._clock() - started)

    async def _retry_after(self, runtime_hash: str, delay: float) -> None:
        await self._sleep(delay)
        if runtime_hash in self._jobs:
            self._push(runtime_hash)

    async def _attempt(self, runtime_hash: str, record: RuntimeRecord) -> None:
        """One bounded ``stage`` of ``record``, shared by everyone who asks while it runs."""
        while True:
            if runtime_hash in self._ready:
                return
            pending = self._inflight.get(runtime_hash)
            if pending is None:
                break
            try:
                await asyncio.shield(pending)
                return
            except _OwnerGone:
                continue
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight[runtime_hash] = future
        bound = asyncio.timeout(self._attempt_timeout_s)
        try:
            try:
                async with bound:
                    await self._stage(record)
            except TimeoutError as exc:
                if not bound.expired():
                    raise HostError(f"staging runtime {runtime_hash} failed: {exc}") from exc
                raise StagingTimeout(
                    f"staging runtime {runtime_hash} did not finish within {self._attempt_timeout_s:g}s; abandoned"
                ) from exc
            except WarrenError:
                raise
            except Exception as exc:
                raise HostError(f"staging runtime {runtime_hash} failed: {type(exc).__name__}: {exc}") from exc
        except BaseException as exc:
            future.set_exception(exc if isinstance(exc, Exception) else _OwnerGone())
            future.exception()  # retrieved: waiters are optional
            raise
        else:
            self._ready.add(runtime_hash)
            self._failed.discard(runtime_hash)
            future.set_result(None)
        finally:
            del self._inflight[runtime_hash]


__all__ = ["PrewarmState", "Prewarmer", "StageFn", "StagingTimeout"]

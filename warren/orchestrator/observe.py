"""How long lifecycle operations take, told to whoever listens: the seam the node's Prometheus metrics
hang on (``warren.api.metrics``), so that the orchestrator imports no metrics library.

The manager times each operation once, where every caller passes (the API, the proxy's auto-resume, the
shutdown's pauses); the TTL timers, which call the transitions directly, use the same :func:`timed`.
A call naming a sandbox the node does not hold is not observed (a 404 before anything ran); a create
that fails, for any reason, is. An observer gets ``(operation, runtime, outcome, seconds)``; labels come
from closed sets (:class:`Operation`, ``runc``/``gvisor``/``unknown``, :class:`Outcome`), never from a
request's text.
"""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Callable, Iterator

from ..runtime.base import RuntimeKind

UNKNOWN_RUNTIME = "unknown"
"""The runtime of a create that failed before it was known (no such template, or a made-up runtime)."""


class Operation(enum.StrEnum):
    CREATE = "create"  # templates, snapshots, warm-pool claims
    PAUSE = "pause"  # by the API, a TTL that pauses, or the node's shutdown
    RESUME = "resume"  # a connect or resume of a paused sandbox, or traffic that woke it
    KILL = "kill"  # by the API or a TTL that kills
    SNAPSHOT = "snapshot"
    FORK = "fork"  # all N children (an error when any of them failed)


class Outcome(enum.StrEnum):
    OK = "ok"
    ERROR = "error"  # any exception, cancellation included


Observe = Callable[[Operation, str, Outcome, float], None]
"""``observe(operation, runtime, outcome, seconds)``; called on the event loop, must not block."""


def no_observe(operation: Operation, runtime: str, outcome: Outcome, seconds: float) -> None:
    """The default observer: nobody listens."""


def runtime_label(name: str | None) -> str:
    """``name`` if it names a runtime class, else :data:`UNKNOWN_RUNTIME` (never a request's own text)."""
    return name if name in {k.value for k in RuntimeKind} else UNKNOWN_RUNTIME


class Timing:
    """One operation being timed; its runtime may be learnt on the way (a create's, from its record)."""

    def __init__(self, runtime: str | None, skip: bool) -> None:
        self.runtime = runtime_label(runtime)
        self.outcome = Outcome.OK
        self.skip = skip
        """Observe nothing (a connect that found the sandbox running: a TTL change, not a resume)."""


@contextlib.contextmanager
def timed(
    observe: Observe,
    operation: Operation,
    runtime: str | None,
    *,
    skip: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Timing]:
    """Observe the block's duration once, as an error if it raised (or was cancelled), unless the block
    (or the caller, with ``skip``) says to observe nothing."""
    timing = Timing(runtime, skip)
    started = clock()
    try:
        yield timing
    except BaseException:
        timing.outcome = Outcome.ERROR
        raise
    finally:
        if not timing.skip:
            observe(operation, runtime_label(timing.runtime), timing.outcome, clock() - started)


__all__ = ["UNKNOWN_RUNTIME", "Observe", "Operation", "Outcome", "Timing", "no_observe", "runtime_label", "timed"]

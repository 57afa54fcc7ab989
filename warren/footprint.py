"""Caps on the node's own footprint, so threads and memory do not scale with the host's core count.

Python sizes its default executor from the core count (``min(32, cpus + 4)``) and glibc creates
up to ``8 × cores`` malloc arenas, one per thread that contends; on a 128-core host that is 32
I/O threads, each able to pin an arena of its own. The node's blocking work is small and bursty
(SQLite calls, template file copies, ``getaddrinfo``), so a fixed small pool serves it as well
and keeps RSS flat. The caps come from the environment so the DaemonSet can set them next to
the container's resource limits:

    WARREN_EXECUTOR_WORKERS    default executor threads          default min(8, cpus + 4)
    WARREN_HTTP_MAX_KEEPALIVE  idle proxy connections kept open  default 512 (the proxy's own)
    MALLOC_ARENA_MAX           glibc arenas; read by glibc at exec, only reported here

``cpus`` is the scheduler affinity mask, not ``os.cpu_count()``: a cpuset-pinned container
sees only its cores. A CFS quota is not visible there, which is why the cap is also absolute.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .errors import WarrenError
from .ints import parse_optional_int

EXECUTOR_WORKERS_ENV = "WARREN_EXECUTOR_WORKERS"
HTTP_MAX_KEEPALIVE_ENV = "WARREN_HTTP_MAX_KEEPALIVE"
MALLOC_ARENA_MAX_ENV = "MALLOC_ARENA_MAX"

MAX_DEFAULT_EXECUTOR_WORKERS = 8
"""Enough to keep a local disk's queue busy with file copies while SQLite and DNS still get a thread."""

DEFAULT_HTTP_MAX_KEEPALIVE = 512
"""Matches the data-plane proxy's pool today, so wiring the cap in changes nothing by default."""

EXECUTOR_THREAD_PREFIX = "warren-io"


class FootprintConfigError(WarrenError, ValueError):
    """A footprint variable is set to something that is not a positive integer."""


@dataclass(frozen=True)
class FootprintCaps:
    """The caps in force; ``malloc_arena_max`` is None when glibc runs with its own default."""

    executor_workers: int
    http_max_keepalive: int
    malloc_arena_max: int | None


def read_footprint_caps(env: Mapping[str, str], cpus: int | None = None) -> FootprintCaps:
    """Parse the caps without touching any event loop (for the CLI, tests, and diagnostics)."""
    if cpus is None:
        cpus = available_cpus()
    workers = _env_int(env, EXECUTOR_WORKERS_ENV)
    keepalive = _env_int(env, HTTP_MAX_KEEPALIVE_ENV)
    return FootprintCaps(
        executor_workers=min(MAX_DEFAULT_EXECUTOR_WORKERS, cpus + 4) if workers is None else workers,
        http_max_keepalive=DEFAULT_HTTP_MAX_KEEPALIVE if keepalive is None else keepalive,
        malloc_arena_max=_env_int(env, MALLOC_ARENA_MAX_ENV),
    )


def apply_footprint_caps(env: Mapping[str, str]) -> FootprintCaps:
    """Read the caps and install the capped default executor on the running loop.

    Call it first thing in node start, before any ``to_thread``: an executor the loop had
    already created lazily is dropped, not shut down, and its idle threads linger until the
    process exits. ``asyncio.run`` shuts the installed executor down when the loop ends.
    Raises ``FootprintConfigError`` for a value that is not a positive integer.
    """
    caps = read_footprint_caps(env)
    loop = asyncio.get_running_loop()
    loop.set_default_executor(
        ThreadPoolExecutor(max_workers=caps.executor_workers, thread_name_prefix=EXECUTOR_THREAD_PREFIX)
    )
    return caps


def available_cpus() -> int:
    """CPUs this process may run on (cpuset-aware), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    """A positive integer, or None when unset or empty (an empty value in a manifest means unset)."""
    return parse_optional_int(env.get(name), name, minimum=1, error=FootprintConfigError)

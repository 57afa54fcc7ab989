"""Footprint caps: parsing, defaults from the CPU count, and the executor really installed."""

from __future__ import annotations

import asyncio
import threading

import pytest

from warren.errors import WarrenError
from warren.footprint import (
    DEFAULT_HTTP_MAX_KEEPALIVE,
    EXECUTOR_THREAD_PREFIX,
    FootprintCaps,
    FootprintConfigError,
    apply_footprint_caps,
    available_cpus,
    read_footprint_caps,
)


@pytest.mark.parametrize(("cpus", "workers"), [(1, 5), (2, 6), (4, 8), (128, 8)])
def test_default_workers_follow_cpus_up_to_the_cap(cpus: int, workers: int) -> None:
    assert read_footprint_caps({}, cpus=cpus) == FootprintCaps(workers, DEFAULT_HTTP_MAX_KEEPALIVE, None)


def test_environment_overrides_every_cap() -> None:
    env = {"WARREN_EXECUTOR_WORKERS": "3", "WARREN_HTTP_MAX_KEEPALIVE": " 64 ", "MALLOC_ARENA_MAX": "2"}
    assert read_footprint_caps(env, cpus=128) == FootprintCaps(3, 64, 2)


def test_empty_values_mean_unset() -> None:
    env = {"WARREN_EXECUTOR_WORKERS": "", "MALLOC_ARENA_MAX": "  "}
    assert read_footprint_caps(env, cpus=2) == FootprintCaps(6, DEFAULT_HTTP_MAX_KEEPALIVE, None)


@pytest.mark.parametrize("bad", ["0", "-1", "eight", "2.5"])
def test_bad_values_name_the_variable(bad: str) -> None:
    with pytest.raises(FootprintConfigError, match="WARREN_HTTP_MAX_KEEPALIVE must be a positive integer"):
        read_footprint_caps({"WARREN_HTTP_MAX_KEEPALIVE": bad}, cpus=2)
    assert issubclass(FootprintConfigError, WarrenError)


def test_available_cpus_is_positive() -> None:
    assert available_cpus() >= 1


def test_frozen() -> None:
    caps = FootprintCaps(1, 2, None)
    with pytest.raises(AttributeError):
        caps.executor_workers = 5  # type: ignore[misc]


async def test_apply_installs_a_capped_named_default_executor() -> None:
    caps = apply_footprint_caps({"WARREN_EXECUTOR_WORKERS": "2"})
    assert caps.executor_workers == 2
    release = threading.Event()
    names: set[str] = set()

    def work() -> None:
        names.add(threading.current_thread().name)
        release.wait(timeout=10)

    before = set(threading.enumerate())
    loop = asyncio.get_running_loop()
    jobs = [loop.run_in_executor(None, work) for _ in range(4)]
    # ThreadPoolExecutor starts one thread per submit until max_workers, so this is immediate.
    pool_threads = set(threading.enumerate()) - before
    assert len(pool_threads) == 2
    assert all(t.name.startswith(EXECUTOR_THREAD_PREFIX) for t in pool_threads)
    release.set()
    await asyncio.gather(*jobs)
    assert names <= {t.name for t in pool_threads}
    to_thread_name = await asyncio.to_thread(lambda: threading.current_thread().name)
    assert to_thread_name.startswith(EXECUTOR_THREAD_PREFIX), "to_thread uses the capped pool too"


def test_apply_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        apply_footprint_caps({})


def test_apply_rejects_bad_values_before_touching_the_loop() -> None:
    async def main() -> None:
        with pytest.raises(FootprintConfigError):
            apply_footprint_caps({"WARREN_EXECUTOR_WORKERS": "none"})

    asyncio.run(main())

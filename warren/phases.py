"""Wall-clock phases of a node's operations, written as JSON lines when profiling is on.

``WARREN_PROFILE=<file>`` (``bench --profile``) makes the node append one line per finished phase:
``{"op": "pause", "phase": "runtime.pause", "ms": 8.1}``. An operation is named once, where it starts
(:func:`operation`, by the API route); phases inside it (:func:`phase`) are attributed to it through a
context variable, so concurrent operations do not mix. Off (the default), both are a no-op costing one
global read: the hot path pays nothing for being measurable.

Phases may nest; each line is the phase's own wall time including what it awaited, so a profile is
read as a tree (``bench/profile.py`` sums them per operation).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

__all__ = ["configure", "operation", "phase", "qualify"]

_sink: TextIO | None = None
_lock = threading.Lock()
_op: contextvars.ContextVar[str] = contextvars.ContextVar("warren_phase_op", default="-")


def configure(path: Path | None) -> None:
    """Start writing phases to ``path`` (appended, line-buffered), or stop when None."""
    global _sink
    with _lock:
        if _sink is not None:
            _sink.close()
            _sink = None
        if path is not None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            _sink = open(fd, "a", buffering=1, encoding="utf-8")


def _emit(op: str, name: str, seconds: float) -> None:
    line = json.dumps({"op": op, "phase": name, "ms": round(seconds * 1000, 3)})
    with _lock:
        if _sink is not None:
            _sink.write(line + "\n")


@contextlib.contextmanager
def operation(name: str) -> Iterator[None]:
    """Name the operation the phases below belong to, and time all of it as phase ``total``."""
    if _sink is None:
        yield
        return
    token = _op.set(name)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _emit(_op.get(), "total", time.perf_counter() - t0)
        _op.reset(token)


def qualify(detail: str) -> None:
    """Name the current operation more precisely from here on, including its ``total``: ``pause``
    becomes ``pause/gvisor`` once the orchestrator knows the sandbox's runtime. Off: a no-op."""
    if _sink is not None and (op := _op.get()) != "-" and "/" not in op:
        _op.set(f"{op}/{detail}")


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Time one step of the current operation."""
    if _sink is None:
        yield
        return
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _emit(_op.get(), name, time.perf_counter() - t0)

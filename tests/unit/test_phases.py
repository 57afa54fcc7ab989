"""``warren.phases``: off by default (nothing written), on with ``configure``: one JSON line per
phase, attributed to the operation that encloses it even when operations interleave on one loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren import phases


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "phases.jsonl"
    phases.configure(path)
    try:
        yield path
    finally:
        phases.configure(None)


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_off_writes_nothing(tmp_path: Path) -> None:
    with phases.operation("pause"), phases.phase("runtime.pause"):
        pass
    assert list(tmp_path.iterdir()) == []


async def test_interleaved_operations_keep_their_own_phases(sink: Path) -> None:
    async def op(name: str, delay: float) -> None:
        with phases.operation(name):
            with phases.phase("step"):
                await asyncio.sleep(delay)

    await asyncio.gather(op("pause", 0.02), op("connect", 0.01))
    lines = _lines(sink)
    assert {(d["op"], d["phase"]) for d in lines} == {
        ("pause", "step"), ("pause", "total"), ("connect", "step"), ("connect", "total")
    }
    pause_step = next(d for d in lines if d["op"] == "pause" and d["phase"] == "step")
    assert float(pause_step["ms"]) >= 15  # type: ignore[arg-type]


def test_a_phase_outside_any_operation_and_one_that_raises(sink: Path) -> None:
    with pytest.raises(ValueError), phases.phase("alone"):
        raise ValueError
    assert _lines(sink) == [{"op": "-", "phase": "alone", "ms": pytest.approx(0, abs=5)}]


async def test_an_operation_qualified_by_what_it_found(sink: Path) -> None:
    async def resume() -> None:  # the orchestrator, awaited by the route in the same task
        phases.qualify("gvisor")
        with phases.phase("runtime.resume"):
            pass

    with phases.operation("connect"):
        await resume()
    assert {(d["op"], d["phase"]) for d in _lines(sink)} == {("connect/gvisor", "runtime.resume"),
                                                             ("connect/gvisor", "total")}

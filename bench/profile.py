"""``--profile``: where the shared node's time goes, from the phases it wrote (``warren.phases``).

The node appends ``{"op", "phase", "ms"}`` lines to ``WARREN_PROFILE``; :func:`summarise` turns them
into ``{op: {phase: {"n", "p50_ms", "p90_ms"}}}`` for the report. Phases nest (``runtime.pause``
includes ``runtime.freeze`` and ``runtime.save``); ``total`` is the whole API operation, so what it has
beyond its direct phases is request parsing, the lock and the answer.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def summarise(path: Path) -> dict[str, Any]:
    samples: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {"missing": str(path)}
    for line in lines:
        try:
            item = json.loads(line)
            samples[str(item["op"])][str(item["phase"])].append(float(item["ms"]))
        except (ValueError, KeyError, TypeError):
            continue
    return {
        op: {name: {"n": len(v), "p50_ms": _pct(v, 0.5), "p90_ms": _pct(v, 0.9)} for name, v in sorted(phases.items())}
        for op, phases in sorted(samples.items())
    }

"""Percentiles as the benchmark reports them (nearest rank, in milliseconds)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0 < q <= 100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary_ms(values_ms: Sequence[float]) -> dict[str, float | int]:
    """``samples``, ``p50_ms``, ``p99_ms`` and ``max_ms`` of a sample in milliseconds."""
    return {
        "samples": len(values_ms),
        "p50_ms": round(percentile(values_ms, 50), 2),
        "p99_ms": round(percentile(values_ms, 99), 2),
        "max_ms": round(max(values_ms), 2),
    }

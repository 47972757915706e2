"""Helpers every benchmark under bench/ shares: percentiles, a readable table, the final JSON line.

Each benchmark ends by printing exactly one JSON object as the last line of stdout (`emit_json`), so a
script can compare runs with `tail -n 1 | jq`.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence


def percentile(values: Sequence[float], pct: float) -> float:
    """The `pct` percentile (0..100) by linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_summary(samples_ms: Sequence[float]) -> dict:
    """p50/p95/max of latency samples in milliseconds, rounded to 0.1 ms."""
    return {
        "p50_ms": round(percentile(samples_ms, 50), 1),
        "p95_ms": round(percentile(samples_ms, 95), 1),
        "max_ms": round(max(samples_ms), 1),
    }


def print_table(rows: Sequence[dict], columns: Sequence[str]) -> None:
    """Rows of dicts as an aligned text table, columns in the given order."""
    cells = [[str(row.get(col, "")) for col in columns] for row in rows]
    widths = [max([len(col)] + [len(c[i]) for c in cells]) for i, col in enumerate(columns)]
    print("  ".join(col.ljust(w) for col, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for line in cells:
        print(
            "  ".join(
                cell.rjust(w) if i else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(line, widths, strict=True))
            )
        )


def emit_json(figures: dict) -> None:
    """The benchmark's machine-readable result: one JSON line, always the last line of stdout."""
    sys.stdout.flush()
    print(json.dumps(figures, separators=(",", ":"), default=str), flush=True)

"""Scores over a window: starved ratio and load imbalance (definitions in docs/scores.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def starved_ratio(state_seconds: Mapping[str, float]) -> float | None:
    """Return starved seconds / accounted seconds (all states) in [0, 1]; None when nothing is accounted."""
    total = sum(state_seconds.values())
    if total <= 0:
        return None
    return min(1.0, max(0.0, state_seconds.get("starved", 0.0) / total))


def imbalance(activity: Sequence[float]) -> float | None:
    """Return the load imbalance of per-GPU activities in [0, 1]: 0 balanced, 1 one GPU does all the work.

    ``(1 - mean / max) * n / (n - 1)``: one minus the POP "load balance" efficiency (mean / max, as in the
    Scalasca Cube guide), rescaled by n / (n - 1) so that one GPU doing all the work reads 1 for any n.
    With every activity 0 the GPUs are equally (not) working: 0. Returns None for fewer than 2 GPUs.
    Negative inputs are clamped to 0.
    """
    n = len(activity)
    if n < 2:
        return None
    vals = [max(0.0, a) for a in activity]
    top = max(vals)
    if top <= 0:
        return 0.0
    # (1 - mean/max) * n/(n-1) == (n*max - sum) / ((n-1)*max); fsum keeps equal values exactly balanced
    return min(1.0, max(0.0, (n * top - math.fsum(vals)) / ((n - 1) * top)))

"""Scores over a window: starved ratio and load imbalance (definitions in docs/scores.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def starved_ratio(state_seconds: Mapping[str, float]) -> float | None:
    """Return starved seconds / accounted seconds (all states) in [0, 1]; None when nothing is accounted."""
    total = sum(state_seconds.values())
    if total <= 0:
        return None
    return min(1.0, max(0.0, state_seconds.get("starved", 0.0) / total))


def shortfalls(activity: Sequence[float]) -> list[float] | None:
    """Return each GPU's shortfall against the busiest of them, ``1 - activity / max``, in [0, 1] (the busiest
    reads 0; with every activity 0 all read 0). None for fewer than 2 GPUs. Negative inputs are clamped to 0."""
    if len(activity) < 2:
        return None
    vals = [max(0.0, a) for a in activity]
    top = max(vals)
    if top <= 0:
        return [0.0] * len(vals)
    return [min(1.0, max(0.0, 1.0 - v / top)) for v in vals]


def imbalance(activity: Sequence[float]) -> float | None:
    """Return the load imbalance of per-GPU activities in [0, 1]: the largest shortfall, ``1 - min / max``.

    0 balanced (or all idle), 1 when a GPU does nothing while another works. It depends on how far the slowest GPU
    lags the busiest, not on how many GPUs there are: one rank at 30% among seven at 95% reads 0.68 on 2 GPUs or on
    8, where POP's ``1 - mean / max`` (the load-balance efficiency of the Scalasca Cube guide) dilutes it by the
    number of balanced GPUs (0.09 on 8). Returns None for fewer than 2 GPUs.
    """
    falls = shortfalls(activity)
    return max(falls) if falls is not None else None

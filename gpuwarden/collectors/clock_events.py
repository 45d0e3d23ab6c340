"""Clock event (throttle) reasons: why the clocks are below their maximum.

Sources: nvmlDeviceGetCurrentClocksEventReasons (bitmask, decoded by NVML's nvmlClocksEventReason* names). The
cumulative duration counters (NVML_FI_DEV_CLOCKS_EVENT_REASON_*) are declared readings in ``gpuwarden.catalog``.
"""

from __future__ import annotations

import functools

from gpuwarden.catalog import CLOCK_EVENT_REASONS, Family
from gpuwarden.collectors.registry import CollectOptions, add_grown, builds, gpu_rows, new_values, readings
from gpuwarden.families import MetricFamily
from gpuwarden.snapshot import NodeSnapshot


@builds("gpu_clock_event_reason_active")
def reason_active(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return 1 for each clock event reason that holds a GPU's clocks now; the reasons that do not have no series
    (NVML names nine). None when no reason holds any GPU's clocks."""
    active = new_values(fam)
    for g in readings(snap):
        mask = g.clock_event_reasons
        names = _names(mask) if mask else ()
        if names:
            active.labels.extend(gpu_rows(g.index, g.uuid, names))
            active.numbers.extend((1.0,) * len(names))
    return active if active else None


@builds("gpu_clock_event_reason_seconds_total")
def reason_seconds(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the seconds each clock event reason has held a GPU's clocks since the driver loaded (NVML's duration
    counters), for the reasons that have: a reason still at 0 has no series."""
    total = new_values(fam)
    for g in readings(snap):
        add_grown(total, g.index, g.uuid, g.clock_event_seconds_total, sorted(g.clock_event_seconds_total))
    return total if total else None


@functools.lru_cache(maxsize=512)
def _names(mask: int) -> tuple[str, ...]:
    """The names of the reasons set in ``mask`` (nvmlDeviceGetCurrentClocksEventReasons), in bit order."""
    return tuple(name for bit, name in sorted(CLOCK_EVENT_REASONS.items()) if mask & bit)

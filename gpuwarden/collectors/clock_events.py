"""Clock event (throttle) reasons: why the clocks are below their maximum.

Sources: nvmlDeviceGetCurrentClocksEventReasons (bitmask, decoded by NVML's nvmlClocksEventReason* names). The
cumulative duration counters (NVML_FI_DEV_CLOCKS_EVENT_REASON_*) are declared readings in ``gpuwarden.catalog``.
"""

from __future__ import annotations

from gpuwarden.catalog import CLOCK_EVENT_REASONS, Family
from gpuwarden.collectors.registry import CollectOptions, builds, gpu_rows, new_values, readings
from gpuwarden.series import Series
from gpuwarden.snapshot import NodeSnapshot


@builds("gpu_clock_event_reason_active")
def reason_active(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> Series | None:
    """Return 0/1 per clock event reason and GPU (every reason NVML names), None when no GPU reports the mask."""
    active = new_values(fam)
    for g in readings(snap):
        mask = g.clock_event_reasons
        if mask is not None:
            active.labels.extend(gpu_rows(g.index, g.uuid, _NAMES))
            active.numbers.extend([1.0 if mask & bit else 0.0 for bit in _BITS])
    return active if active else None


_BITS = tuple(CLOCK_EVENT_REASONS)
_NAMES = tuple(CLOCK_EVENT_REASONS.values())

"""Clock event (throttle) reasons: why the clocks are below their maximum.

Sources: nvmlDeviceGetCurrentClocksEventReasons (bitmask, decoded by NVML's nvmlClocksEventReason*
names), and the cumulative duration counters NVML_FI_DEV_CLOCKS_EVENT_REASON_* (nanoseconds in NVML,
seconds here) where the GPU keeps them (sw_power_cap, sync_boost, sw/hw thermal slowdown, power brake).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from exporter.collectors.base import CollectOptions, collector, counter, gauge, gpu_label_values, readings
from exporter.model import CLOCK_EVENT_REASONS
from exporter.poller import NodeSnapshot


@collector("clock_events", help="Clock event (throttle) reasons as 0/1 per reason, and seconds per reason")
def collect(snap: NodeSnapshot, opts: CollectOptions) -> Iterable[Metric]:
    """Yield gpu_clock_event_reason_active{reason} and gpu_clock_event_reason_seconds_total{reason}."""
    active = gauge(
        "gpu_clock_event_reason_active",
        "1 when this clock event reason holds the clocks down now (nvmlDeviceGetCurrentClocksEventReasons).",
        ["reason"],
    )
    total = counter(
        "gpu_clock_event_reason_seconds",
        "Cumulative time the clocks were held down for this reason, in seconds (NVML duration counters).",
        ["reason"],
    )
    for g in readings(snap):
        labels = gpu_label_values(g)
        if g.clock_event_reasons is not None:
            for bit, name in CLOCK_EVENT_REASONS.items():
                active.add_metric([*labels, name], 1.0 if g.clock_event_reasons & bit else 0.0)
        for name, seconds in sorted(g.clock_event_seconds_total.items()):
            total.add_metric([*labels, name], seconds)
    if active.samples:
        yield active
    if total.samples:
        yield total

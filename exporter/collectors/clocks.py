"""Clocks and performance state: current and maximum SM, memory, graphics and video clocks; P-state.

Sources: nvmlDeviceGetClockInfo (every poll), nvmlDeviceGetMaxClockInfo (once: 1.3 ms a call),
nvmlDeviceGetPerformanceState. NVML reports MHz; exported in hertz.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from exporter.collectors.base import CollectOptions, collector, gauge, gpu_label_values, per_gpu_gauge, readings
from exporter.poller import NodeSnapshot


@collector("clocks", help="Current and maximum clocks (SM, memory, graphics, video) and P-state")
def collect(snap: NodeSnapshot, opts: CollectOptions) -> Iterable[Metric]:
    """Yield gpu_clock_hertz{clock}, gpu_clock_max_hertz{clock}, gpu_performance_state."""
    cur = gauge("gpu_clock_hertz", "Current clock frequency, in hertz.", ["clock"])
    for g in readings(snap):
        for domain, hz in sorted(g.clock_hertz.items()):
            cur.add_metric([*gpu_label_values(g), domain], hz)
    if cur.samples:
        yield cur
    mx = gauge("gpu_clock_max_hertz", "Maximum clock frequency of the GPU, in hertz.", ["clock"])
    for s in snap.static.gpus:
        for domain, hz in sorted(s.clock_max_hertz.items()):
            mx.add_metric([*gpu_label_values(s), domain], hz)
    if mx.samples:
        yield mx
    ps = per_gpu_gauge(
        snap,
        "gpu_performance_state",
        "Performance state (P-state): 0 is the highest performance, 15 the lowest.",
        lambda g: g.performance_state,
    )
    if ps is not None:
        yield ps

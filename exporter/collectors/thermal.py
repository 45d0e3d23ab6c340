"""Temperatures and the card's own thresholds, and fan speed where the card has a fan.

Sources: nvmlDeviceGetTemperature (GPU die), field NVML_FI_DEV_MEMORY_TEMP (HBM),
nvmlDeviceGetTemperatureThreshold (shutdown, slowdown, gpu_max, memory_max), nvmlDeviceGetFanSpeed.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from exporter.collectors.base import CollectOptions, collector, gauge, gpu_label_values, per_gpu_gauge, present
from exporter.poller import NodeSnapshot


@collector("thermal", help="GPU and memory temperature, the card's slowdown/shutdown thresholds, fan speed")
def collect(snap: NodeSnapshot, opts: CollectOptions) -> Iterable[Metric]:
    """Yield gpu_temperature_celsius, gpu_memory_temperature_celsius, thresholds and fan speed."""
    yield from present(
        per_gpu_gauge(
            snap,
            "gpu_temperature_celsius",
            "GPU die temperature, in degrees Celsius.",
            lambda g: g.temperature_gpu_celsius,
        ),
        per_gpu_gauge(
            snap,
            "gpu_memory_temperature_celsius",
            "Device memory (HBM) temperature, in degrees Celsius.",
            lambda g: g.temperature_memory_celsius,
        ),
        per_gpu_gauge(
            snap,
            "gpu_fan_speed_ratio",
            "Fan speed as a fraction of its maximum (cards with a fan only).",
            lambda g: g.fan_speed_ratio,
        ),
    )
    th = gauge(
        "gpu_temperature_threshold_celsius",
        "The card's temperature thresholds: slowdown (clocks drop), shutdown, gpu_max and memory_max (max operating).",
        ["threshold"],
    )
    for s in snap.static.gpus:
        for name, value in sorted(s.temperature_thresholds_celsius.items()):
            th.add_metric([*gpu_label_values(s), name], value)
    if th.samples:
        yield th

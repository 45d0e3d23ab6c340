"""Power and energy: draw, enforced and default limits, cumulative energy.

Sources: nvmlDeviceGetPowerUsage, nvmlDeviceGetEnforcedPowerLimit, nvmlDeviceGetPowerManagementDefaultLimit,
nvmlDeviceGetTotalEnergyConsumption (3 ms a call on an H100: read at the slow cadence, 10 s by default).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from exporter.collectors.base import (
    CollectOptions,
    collector,
    counter,
    gpu_label_values,
    per_gpu_gauge,
    present,
    readings,
    static_gauge,
)
from exporter.poller import NodeSnapshot


@collector("power", help="Power draw, enforced/default power limits, energy counter")
def collect(snap: NodeSnapshot, opts: CollectOptions) -> Iterable[Metric]:
    """Yield gpu_power_usage_watts, gpu_power_limit_watts, gpu_power_default_limit_watts, gpu_energy_joules_total."""
    yield from present(
        per_gpu_gauge(
            snap, "gpu_power_usage_watts", "Power draw of the board, in watts.", lambda g: g.power_usage_watts
        ),
        per_gpu_gauge(
            snap,
            "gpu_power_limit_watts",
            "Power limit the driver enforces now, in watts.",
            lambda g: g.power_limit_watts,
        ),
    )
    default = static_gauge(
        snap,
        "gpu_power_default_limit_watts",
        "Default power limit of the board, in watts.",
        lambda s: s.power_limit_default_watts,
    )
    if default is not None:
        yield default
    energy = counter(
        "gpu_energy_joules", "Energy consumed since the driver loaded, in joules (read every slow interval)."
    )
    for g in readings(snap):
        if g.energy_joules_total is not None:
            energy.add_metric(gpu_label_values(g), g.energy_joules_total)
    if energy.samples:
        yield energy

"""Device memory from nvmlDeviceGetMemoryInfo (v2): total, used, free, reserved bytes."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from exporter.collectors.base import CollectOptions, collector, per_gpu_gauge
from exporter.poller import NodeSnapshot

_FIELDS = (
    ("total", "Total device memory"),
    ("used", "Device memory used by allocations"),
    ("free", "Device memory free"),
    ("reserved", "Device memory reserved by the driver and firmware"),
)


@collector("memory", help="Device memory total/used/free/reserved (nvmlDeviceGetMemoryInfo v2)")
def collect(snap: NodeSnapshot, opts: CollectOptions) -> Iterable[Metric]:
    """Yield gpu_memory_{total,used,free,reserved}_bytes."""
    for key, doc in _FIELDS:
        attr = f"memory_{key}_bytes"
        fam = per_gpu_gauge(snap, f"gpu_memory_{key}_bytes", f"{doc}, in bytes.", lambda g, a=attr: getattr(g, a))
        if fam is not None:
            yield fam

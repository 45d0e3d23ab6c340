"""Collectors: one module per metric domain, registered by name in ``exporter.collectors.base``.

Importing this package imports every collector module, which registers it.
"""

from exporter.collectors import (  # noqa: F401 - imported for registration
    clock_events,
    clocks,
    device,
    ecc,
    gpm,
    insight,
    memory,
    mig,
    pcie,
    power,
    processes,
    self_metrics,
    thermal,
    utilization,
    xid,
)
from exporter.collectors.base import REGISTRY, CollectOptions, CollectorSpec, collector

__all__ = ["REGISTRY", "CollectOptions", "CollectorSpec", "collector"]

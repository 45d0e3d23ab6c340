"""Utilization from nvmlDeviceGetUtilizationRates: ``gpu_utilization_ratio``, ``gpu_memory_copy_utilization_ratio``.

Note (NVML docs): util.gpu is the fraction of the sample period in which *a kernel was running*, not how
much of the GPU worked; ``gpu_sm_activity_ratio`` (GPM collector) tells the two apart.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from exporter.collectors.base import CollectOptions, collector, per_gpu_gauge, present
from exporter.poller import NodeSnapshot


@collector("utilization", help="GPU and memory-controller utilization (nvmlDeviceGetUtilizationRates)")
def collect(snap: NodeSnapshot, opts: CollectOptions) -> Iterable[Metric]:
    """Yield the two utilization gauges (0-1)."""
    yield from present(
        per_gpu_gauge(
            snap,
            "gpu_utilization_ratio",
            "Fraction of the last sample period in which one or more kernels ran on the GPU (NVML util.gpu).",
            lambda g: g.utilization_gpu_ratio,
        ),
        per_gpu_gauge(
            snap,
            "gpu_memory_copy_utilization_ratio",
            "Fraction of the last sample period in which device memory was read or written (NVML util.memory).",
            lambda g: g.utilization_memory_ratio,
        ),
    )

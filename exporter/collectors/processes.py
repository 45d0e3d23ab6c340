"""Compute processes on each GPU: count, and GPU memory per process (bounded).

Sources: nvmlDeviceGetComputeRunningProcesses (host PIDs) and /proc through psutil (process name).
Per-process series are limited to the ``max_processes_per_gpu`` largest by GPU memory, so a GPU shared by
many processes cannot blow up cardinality; the series of an ended process disappear with it.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from exporter.collectors.base import CollectOptions, collector, gauge, gpu_label_values, readings
from exporter.poller import NodeSnapshot


@collector("processes", help="Compute process count and GPU memory per process (top N per GPU)")
def collect(snap: NodeSnapshot, opts: CollectOptions) -> Iterable[Metric]:
    """Yield gpu_compute_processes and gpu_process_memory_used_bytes{pid,process_name}."""
    count = gauge("gpu_compute_processes", "Number of compute processes holding a context on the GPU.")
    mem = gauge(
        "gpu_process_memory_used_bytes",
        "GPU memory used by one process, in bytes (the largest processes of each GPU only).",
        ["pid", "process_name"],
    )
    for g in readings(snap):
        if g.processes is None:
            continue
        labels = gpu_label_values(g)
        count.add_metric(labels, len(g.processes))
        known = [p for p in g.processes if p.gpu_memory_bytes is not None]
        known.sort(key=lambda p: (-(p.gpu_memory_bytes or 0), p.pid))
        for p in known[: opts.max_processes_per_gpu]:
            mem.add_metric([*labels, str(p.pid), p.name or ""], p.gpu_memory_bytes or 0)
    if count.samples:
        yield count
    if mem.samples:
        yield mem

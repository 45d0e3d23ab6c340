"""Compute processes on each GPU: count, and GPU memory per process (bounded).

Sources: nvmlDeviceGetComputeRunningProcesses (host PIDs) and /proc through psutil (process name).
Per-process series are limited to the ``max_processes_per_gpu`` largest by GPU memory, so a GPU shared by
many processes cannot blow up cardinality; the series of an ended process disappear with it.
"""

from __future__ import annotations

from prometheus_client.core import Metric

from gpuwarden.catalog import Family
from gpuwarden.collectors.registry import CollectOptions, builds, gpu_label_values, new_family, readings
from gpuwarden.snapshot import NodeSnapshot


@builds("gpu_compute_processes")
def process_count(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> Metric | None:
    """Return the number of compute processes per GPU where the process list was read."""
    count = new_family(fam)
    for g in readings(snap):
        if g.processes is not None:
            count.add_metric(gpu_label_values(g), len(g.processes))  # type: ignore[attr-defined]
    return count if count.samples else None


@builds("gpu_process_memory_used_bytes")
def process_memory(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> Metric | None:
    """Return the GPU memory of the ``max_processes_per_gpu`` largest processes of each GPU, in bytes."""
    mem = new_family(fam)
    for g in readings(snap):
        if g.processes is None:
            continue
        labels = gpu_label_values(g)
        known = [p for p in g.processes if p.gpu_memory_bytes is not None]
        known.sort(key=lambda p: (-(p.gpu_memory_bytes or 0), p.pid))
        for p in known[: opts.max_processes_per_gpu]:
            mem.add_metric([*labels, str(p.pid), p.name or ""], p.gpu_memory_bytes or 0)  # type: ignore[attr-defined]
    return mem if mem.samples else None


@builds("gpu_pod_info")
def pod_info(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> Metric | None:
    """Return one series per container the kubelet assigned each GPU (GpuReading.pods, from pod-resources List)."""
    info = new_family(fam)
    for g in readings(snap):
        for a in g.pods:
            info.add_metric(  # type: ignore[attr-defined]
                gpu_label_values(g),
                {"namespace": a.namespace, "pod": a.pod, "container": a.container, "device_id": a.device_id,
                 "resource": a.resource},
            )  # fmt: skip
    return info if info.samples else None

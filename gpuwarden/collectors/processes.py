"""Compute processes on each GPU: count, and GPU memory per process (bounded).

Sources: nvmlDeviceGetComputeRunningProcesses (host PIDs) and /proc through psutil (process name and start time).
Per-process series are limited to the ``max_processes_per_gpu`` largest by GPU memory, so a GPU shared by
many processes cannot blow up cardinality; the series of an ended process disappear with it.
"""

from __future__ import annotations

from gpuwarden.catalog import Family
from gpuwarden.collectors.registry import CollectOptions, builds, gpu_label_values, new_family, new_values, readings
from gpuwarden.families import MetricFamily
from gpuwarden.model import GpuReading, ProcessReading
from gpuwarden.snapshot import NodeSnapshot


@builds("gpu_compute_processes")
def process_count(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the number of compute processes per GPU where the process list was read."""
    count = new_values(fam)
    for g in readings(snap):
        if g.processes is not None:
            count.add_metric(gpu_label_values(g), len(g.processes))
    return count if count else None


@builds("gpu_process_memory_used_bytes")
def process_memory(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the GPU memory of the ``max_processes_per_gpu`` largest processes of each GPU, in bytes."""
    mem = new_values(fam)
    for g in readings(snap):
        if g.processes is None:
            continue
        labels = gpu_label_values(g)
        for p in largest(g, opts):
            mem.add_metric([*labels, str(p.pid), p.name or ""], p.gpu_memory_bytes or 0)
    return mem if mem else None


def largest(g: GpuReading, opts: CollectOptions) -> list[ProcessReading]:
    """The ``max_processes_per_gpu`` processes of ``g`` holding the most GPU memory (known memory only), largest
    first, ties by pid: the processes every per-process series of a GPU is about."""
    known = [p for p in g.processes or () if p.gpu_memory_bytes is not None]
    known.sort(key=lambda p: (-(p.gpu_memory_bytes or 0), p.pid))
    return known[: opts.max_processes_per_gpu]


@builds("gpu_process_start_time_seconds")
def process_start(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the start time (Unix seconds, ProcessReading.create_time from psutil) of the processes of
    gpu_process_memory_used_bytes whose start /proc gave."""
    start = new_values(fam)
    for g in readings(snap):
        labels = gpu_label_values(g)
        for p in largest(g, opts):
            if p.create_time is not None:
                start.add_metric([*labels, str(p.pid), p.name or ""], p.create_time)
    return start if start else None


@builds("gpu_pod_info")
def pod_info(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return one series per container the kubelet assigned each GPU (GpuReading.pods, from pod-resources List)."""
    info = new_family(fam)
    for g in readings(snap):
        for a in g.pods:
            info.add_metric(
                gpu_label_values(g),
                {"namespace": a.namespace, "pod": a.pod, "container": a.container, "device_id": a.device_id,
                 "resource": a.resource},
            )  # fmt: skip
    return info if info else None


def process_shares(g: GpuReading) -> dict[int, float]:
    """pid -> the process's share of the GPU's time (0-1): NVML's per-process smUtil (ProcessReading.
    sm_utilization_ratio), scaled by util.gpu / their sum where they add up to more than the device's util.gpu.

    NVML samples processes and the device separately, so the per-process values of a GPU shared by several processes
    (time-slicing, MPS) can add up to more than the device's own value; scaling keeps each process's relative share
    and guarantees that the shares of a GPU's processes, and so of its jobs, never exceed the device's value. Without
    util.gpu the sum is capped at 1. Processes without a sample are absent.
    """
    known = {p.pid: p.sm_utilization_ratio for p in g.processes or () if p.sm_utilization_ratio is not None}
    total = sum(known.values())
    limit = g.utilization_gpu_ratio if g.utilization_gpu_ratio is not None else 1.0
    scale = limit / total if total > limit else 1.0
    return {pid: v * scale for pid, v in known.items()}


@builds("gpu_process_sm_utilization_ratio")
def process_utilization(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return each process's share of its GPU (process_shares) for the ``max_processes_per_gpu`` largest processes
    by GPU memory, as gpu_process_memory_used_bytes."""
    util = new_values(fam)
    for g in readings(snap):
        shares = process_shares(g)
        if not shares:
            continue
        labels = gpu_label_values(g)
        procs = sorted(g.processes or (), key=lambda p: (-(p.gpu_memory_bytes or 0), p.pid))
        for p in procs[: opts.max_processes_per_gpu]:
            if p.pid in shares:
                util.add_metric([*labels, str(p.pid), p.name or ""], shares[p.pid])
    return util if util else None

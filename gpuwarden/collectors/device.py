"""Identity and presence: ``gpu_info``, ``gpu_driver_info``, ``gpu_up``, ``gpu_reading_unsupported``,
``gpu_reading_failing``, ``gpu_devices``.

Sources: static facts (nvmlDeviceGetName/UUID/PciInfo/Serial/VbiosVersion/Architecture,
nvmlSystemGetDriverVersion, ...) and whether this poll could read the GPU at all.
"""

from __future__ import annotations

from gpuwarden.catalog import Family
from gpuwarden.collectors.registry import CollectOptions, builds, gpu_label_values, gpu_rows, new_family, new_values
from gpuwarden.families import MetricFamily
from gpuwarden.snapshot import NodeSnapshot


@builds("gpu_info")
def gpu_info(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily:
    """Return one info sample per GPU with its identity labels (unknown values left out; minor number 0 kept)."""
    info = new_family(fam)
    for s in snap.static.gpus:
        values = {k: getattr(s, k) for k in fam.labels}
        info.add_metric(gpu_label_values(s), {k: str(v) for k, v in values.items() if v is not None and v != ""})
    return info


@builds("gpu_driver_info")
def driver_info(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily:
    """Return the node's driver, NVML and CUDA driver versions as one info sample."""
    info = new_family(fam)
    values = {k: getattr(snap.static, k) for k in fam.labels}
    info.add_metric([], {k: v for k, v in values.items() if v})
    return info


@builds("gpu_up")
def gpu_up(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily:
    """Return 1 per GPU that answered the last poll, 0 per GPU that did not (empty before the first poll)."""
    up = new_values(fam)
    if snap.poll is not None:
        for g in snap.poll.gpus:
            up.labels.append(gpu_rows(g.index, g.uuid)[0])
            up.numbers.append(1.0 if g.up else 0.0)
    return up


@builds("gpu_reading_unsupported")
def reading_unsupported(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return 1 per GPU and reading it never answers (``GpuReading.unsupported``); None when every GPU answers all."""
    out = new_values(fam)
    if snap.poll is not None:
        for g in snap.poll.gpus:
            for name in g.unsupported:
                out.add_metric([*gpu_label_values(g), name], 1.0)
    return out if out else None


@builds("gpu_reading_failing")
def reading_failing(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return 1 per GPU, reading and error whose last read failed (``GpuReading.failing``); None when none did."""
    out = new_values(fam)
    if snap.poll is not None:
        for g in snap.poll.gpus:
            for name, error in g.failing.items():
                out.add_metric([*gpu_label_values(g), name, error], 1.0)
    return out if out else None


@builds("gpu_devices")
def gpu_devices(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily:
    """Return the number of GPUs watched, labelled with the node's name (``CollectOptions.node_name``, else the host
    name), which stays when the daemon restarts under another ``instance``."""
    count = new_values(fam)
    count.add_metric([opts.node_name or snap.static.hostname], len(snap.static.gpus))
    return count

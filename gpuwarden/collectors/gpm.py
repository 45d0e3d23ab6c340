"""GPM activity (Hopper and newer): the pipe activities as one family with a ``pipe`` label.

The other GPM families (SM activity and occupancy, tensor, DRAM, NVLink, PCIe rates) are declared readings of
``gpuwarden.catalog``. Averages over the last GPM interval (``gpm_interval_seconds``) from nvmlGpmMetricsGet; names
follow DCGM's profiling fields (SM activity = DCGM_FI_PROF_SM_ACTIVE, SM occupancy = DCGM_FI_PROF_SM_OCCUPANCY).
"""

from __future__ import annotations

from gpuwarden.catalog import Family
from gpuwarden.collectors.registry import CollectOptions, builds, gpu_rows, new_values, readings
from gpuwarden.families import MetricFamily
from gpuwarden.insight.ofu import flop_utilization
from gpuwarden.snapshot import NodeSnapshot

#: label value of ``pipe`` -> key of GpuReading.gpm
PIPES = (
    ("fp16", "fp16_activity"),
    ("fp32", "fp32_activity"),
    ("fp64", "fp64_activity"),
    ("integer", "integer_activity"),
)


@builds("gpu_pipe_activity_ratio")
def pipe_activity(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the FP16, FP32, FP64 and integer pipe activities (0-1) of each GPU that has them."""
    pipes = new_values(fam)
    for g in readings(snap):
        gpm = g.gpm
        have = tuple((pipe, key) for pipe, key in PIPES if key in gpm)
        if not have:
            continue
        pipes.labels.extend(gpu_rows(g.index, g.uuid, tuple(pipe for pipe, _ in have)))
        pipes.numbers.extend([float(gpm[key]) for _, key in have])
    return pipes if pipes else None


@builds("gpu_flop_utilization_ratio")
def flop_utilization_ratio(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return each GPU's OFU (gpuwarden.insight.ofu.flop_utilization), where GPM gives its tensor activity."""
    statics = {s.index: s for s in snap.static.gpus}
    ofu = new_values(fam)
    for g in readings(snap):
        value = flop_utilization(g, statics.get(g.index))
        if value is not None:
            ofu.add_metric(gpu_rows(g.index, g.uuid)[0], value)
    return ofu if ofu else None

"""GPM activity (Hopper and newer): SM activity and occupancy, tensor, DRAM, FP pipes, NVLink.

Averages over the last GPM interval (``gpm_interval_seconds``, default 10 s) from nvmlGpmMetricsGet; names
follow DCGM's profiling fields (SM activity = DCGM_FI_PROF_SM_ACTIVE, SM occupancy = DCGM_FI_PROF_SM_OCCUPANCY,
...). Absent on GPUs without GPM; NVLink series only on GPUs that have NVLink links.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from exporter.collectors.base import CollectOptions, collector, gauge, gpu_label_values, per_gpu_gauge, readings
from exporter.poller import NodeSnapshot

_ACTIVITIES = (
    (
        "graphics_activity",
        "gpu_graphics_engine_activity_ratio",
        "Fraction of time the graphics or compute engine was active (GPM graphics util).",
    ),
    (
        "sm_activity",
        "gpu_sm_activity_ratio",
        "Fraction of time an SM had at least one warp resident, averaged over all SMs (GPM SM util; DCGM SM activity).",
    ),
    (
        "sm_occupancy",
        "gpu_sm_occupancy_ratio",
        "Resident warps relative to the maximum, averaged over SMs (GPM SM occupancy; DCGM SM occupancy).",
    ),
    (
        "tensor_activity",
        "gpu_tensor_activity_ratio",
        "Fraction of time any tensor pipe was active (GPM any-tensor util).",
    ),
    (
        "dram_activity",
        "gpu_dram_activity_ratio",
        "Device memory bandwidth used relative to the maximum (GPM DRAM bandwidth util).",
    ),
)
_PIPES = (
    ("fp16", "fp16_activity"),
    ("fp32", "fp32_activity"),
    ("fp64", "fp64_activity"),
    ("integer", "integer_activity"),
)


@collector("gpm", help="GPM activity: SM activity/occupancy, tensor, DRAM, FP16/32/64/integer pipes, NVLink")
def collect(snap: NodeSnapshot, opts: CollectOptions) -> Iterable[Metric]:
    """Yield the GPM activity ratios, gpu_pipe_activity_ratio{pipe} and NVLink rates."""
    for key, name, doc in _ACTIVITIES:
        fam = per_gpu_gauge(snap, name, doc, lambda g, k=key: g.gpm.get(k))
        if fam is not None:
            yield fam
    pipes = gauge("gpu_pipe_activity_ratio", "Fraction of time the SMs used this non-tensor pipe (GPM).", ["pipe"])
    for g in readings(snap):
        for pipe, key in _PIPES:
            if key in g.gpm:
                pipes.add_metric([*gpu_label_values(g), pipe], g.gpm[key])
    if pipes.samples:
        yield pipes
    has_nvlink = {s.index for s in snap.static.gpus if s.nvlink_link_count}
    for key, name, doc in (
        ("nvlink_rx_bytes_per_second", "gpu_nvlink_receive_bytes_per_second", "NVLink receive rate, all links."),
        ("nvlink_tx_bytes_per_second", "gpu_nvlink_transmit_bytes_per_second", "NVLink transmit rate, all links."),
    ):
        fam = per_gpu_gauge(
            snap,
            name,
            doc + " Bytes per second (GPM).",
            lambda g, k=key: g.gpm.get(k) if g.index in has_nvlink else None,
        )
        if fam is not None:
            yield fam

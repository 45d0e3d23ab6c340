"""MIG: memory and GPM activity of each MIG device (MIG mode itself is a declared family).

Sources: nvmlDeviceGetMigDeviceHandleByIndex, nvmlDeviceGetMemoryInfo on the MIG handle, nvmlGpmMigSampleGet.
util.gpu is unsupported on MIG devices: GPM activity is the utilization.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuwarden.catalog import Family
from gpuwarden.collectors.registry import (
    Builder,
    CollectOptions,
    builds,
    gpu_label_values,
    new_values,
    readings,
)
from gpuwarden.families import MetricFamily
from gpuwarden.model import MigReading
from gpuwarden.snapshot import NodeSnapshot


def _mig_family(get: Callable[[MigReading], float | None]) -> Builder:
    def build(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
        metric = new_values(fam)
        for g in readings(snap):
            for m in g.mig:
                value = get(m)
                if value is not None:
                    ci = "" if m.compute_instance_id is None else str(m.compute_instance_id)
                    labels = [*gpu_label_values(g), m.uuid, str(m.gpu_instance_id), ci]
                    metric.add_metric(labels, value)
        return metric if metric else None

    build.__doc__ = "Return one sample per MIG device that has the value, None when none has."
    return build


builds("gpu_mig_memory_used_bytes")(_mig_family(lambda m: m.memory_used_bytes))
builds("gpu_mig_memory_total_bytes")(_mig_family(lambda m: m.memory_total_bytes))
builds("gpu_mig_sm_activity_ratio")(_mig_family(lambda m: m.gpm.get("sm_activity")))
builds("gpu_mig_sm_occupancy_ratio")(_mig_family(lambda m: m.gpm.get("sm_occupancy")))
builds("gpu_mig_tensor_activity_ratio")(_mig_family(lambda m: m.gpm.get("tensor_activity")))
builds("gpu_mig_dram_activity_ratio")(_mig_family(lambda m: m.gpm.get("dram_activity")))
builds("gpu_mig_graphics_engine_activity_ratio")(_mig_family(lambda m: m.gpm.get("graphics_activity")))

"""MIG: mode per GPU, and memory and GPM activity of each MIG device.

Sources: nvmlDeviceGetMigMode (once), nvmlDeviceGetMigDeviceHandleByIndex, nvmlDeviceGetMemoryInfo on the
MIG handle, nvmlGpmMigSampleGet. util.gpu is unsupported on MIG devices: GPM activity is the utilization.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from exporter.collectors.base import CollectOptions, collector, gauge, gpu_label_values, readings, static_gauge
from exporter.poller import NodeSnapshot

_MIG_LABELS = ["mig_uuid", "gpu_instance", "compute_instance"]
_MIG_GPM = (
    ("sm_activity", "gpu_mig_sm_activity_ratio", "SM activity of the MIG device (GPM)."),
    ("sm_occupancy", "gpu_mig_sm_occupancy_ratio", "SM occupancy of the MIG device (GPM)."),
    ("tensor_activity", "gpu_mig_tensor_activity_ratio", "Tensor pipe activity of the MIG device (GPM)."),
    ("dram_activity", "gpu_mig_dram_activity_ratio", "DRAM bandwidth used by the MIG device (GPM)."),
    ("graphics_activity", "gpu_mig_graphics_engine_activity_ratio", "Engine activity of the MIG device (GPM)."),
)


@collector("mig", help="MIG mode, and memory and GPM activity per MIG device")
def collect(snap: NodeSnapshot, opts: CollectOptions) -> Iterable[Metric]:
    """Yield gpu_mig_mode_enabled and, per MIG device, memory and activity gauges."""
    mode = static_gauge(snap, "gpu_mig_mode_enabled", "1 when MIG mode is enabled on the GPU.", lambda s: s.mig_enabled)
    if mode is not None:
        yield mode
    used = gauge("gpu_mig_memory_used_bytes", "Memory used on the MIG device, in bytes.", _MIG_LABELS)
    total = gauge("gpu_mig_memory_total_bytes", "Memory of the MIG device, in bytes.", _MIG_LABELS)
    acts = {key: gauge(name, doc, _MIG_LABELS) for key, name, doc in _MIG_GPM}
    for g in readings(snap):
        for m in g.mig:
            labels = [
                *gpu_label_values(g),
                m.uuid,
                str(m.gpu_instance_id),
                "" if m.compute_instance_id is None else str(m.compute_instance_id),
            ]
            if m.memory_used_bytes is not None:
                used.add_metric(labels, m.memory_used_bytes)
            if m.memory_total_bytes is not None:
                total.add_metric(labels, m.memory_total_bytes)
            for key, fam in acts.items():
                if key in m.gpm:
                    fam.add_metric(labels, m.gpm[key])
    for fam in (used, total, *acts.values()):
        if fam.samples:
            yield fam

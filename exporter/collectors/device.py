"""Identity and presence: ``gpu_info``, ``gpu_driver_info``, ``gpu_up``, ``gpu_devices``.

Sources: static facts (nvmlDeviceGetName/UUID/PciInfo/Serial/VbiosVersion/Architecture,
nvmlSystemGetDriverVersion, ...) and whether this poll could read the GPU at all.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric

from exporter.collectors.base import CollectOptions, collector, gauge, gpu_label_values
from exporter.poller import NodeSnapshot


@collector("device", help="GPU identity (gpu_info), driver versions, up/down per GPU, GPU count")
def collect(snap: NodeSnapshot, opts: CollectOptions) -> Iterable[Metric]:
    """Yield gpu_info, gpu_driver_info, gpu_up and gpu_devices."""
    info = InfoMetricFamily(
        "gpu",
        "Identity of each GPU (value 1): name, PCI bus id, serial, VBIOS, architecture, compute capability.",
        labels=["gpu", "uuid"],
    )
    for s in snap.static.gpus:
        fields = {
            "name": s.name,
            "pci_bus_id": s.pci_bus_id,
            "serial": s.serial,
            "vbios_version": s.vbios_version,
            "architecture": s.architecture,
            "compute_capability": s.compute_capability,
        }
        info.add_metric(gpu_label_values(s), {k: v for k, v in fields.items() if v})
    yield info
    node = snap.static
    drv = {
        "driver_version": node.driver_version,
        "nvml_version": node.nvml_version,
        "cuda_driver_version": node.cuda_driver_version,
    }
    driver = InfoMetricFamily("gpu_driver", "NVIDIA driver, NVML and CUDA driver versions of the node (value 1).")
    driver.add_metric([], {k: v for k, v in drv.items() if v})
    yield driver
    up = gauge("gpu_up", "1 when the GPU answered this poll, 0 when it could not be read (lost, off the bus).")
    if snap.poll is not None:
        for g in snap.poll.gpus:
            up.add_metric(gpu_label_values(g), 1.0 if g.up else 0.0)
    yield up
    yield GaugeMetricFamily(
        "gpu_devices", "Number of GPUs gpuwarden watches on this node.", value=len(snap.static.gpus)
    )

"""PCIe: link generation and width (current and maximum), traffic rates, replay errors.

Sources: nvmlDeviceGetCurrPcieLinkGeneration/Width, nvmlDeviceGetMaxPcieLinkGeneration/Width (once),
GPM metrics NVML_GPM_METRIC_PCIE_RX/TX_PER_SEC (Hopper and newer) for rates - never
nvmlDeviceGetPcieThroughput, which blocks 20 ms per call - and field NVML_FI_DEV_PCIE_REPLAY_COUNTER.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from exporter.collectors.base import (
    CollectOptions,
    collector,
    counter,
    gpu_label_values,
    per_gpu_gauge,
    present,
    readings,
    static_gauge,
)
from exporter.poller import NodeSnapshot


@collector("pcie", help="PCIe link generation/width, RX/TX bytes per second (GPM), replay errors")
def collect(snap: NodeSnapshot, opts: CollectOptions) -> Iterable[Metric]:
    """Yield the PCIe link gauges, gpu_pcie_{receive,transmit}_bytes_per_second, gpu_pcie_replay_errors_total."""
    yield from present(
        per_gpu_gauge(snap, "gpu_pcie_link_generation", "Current PCIe link generation.", lambda g: g.pcie_generation),
        per_gpu_gauge(snap, "gpu_pcie_link_width", "Current PCIe link width (lanes).", lambda g: g.pcie_width),
        per_gpu_gauge(
            snap,
            "gpu_pcie_receive_bytes_per_second",
            "PCIe traffic to the GPU (host to device), bytes per second over the last GPM interval.",
            lambda g: g.gpm.get("pcie_rx_bytes_per_second"),
        ),
        per_gpu_gauge(
            snap,
            "gpu_pcie_transmit_bytes_per_second",
            "PCIe traffic from the GPU (device to host), bytes per second over the last GPM interval.",
            lambda g: g.gpm.get("pcie_tx_bytes_per_second"),
        ),
    )
    for name, attr, doc in (
        ("gpu_pcie_link_max_generation", "pcie_max_generation", "Maximum PCIe link generation of the GPU and slot."),
        ("gpu_pcie_link_max_width", "pcie_max_width", "Maximum PCIe link width (lanes)."),
    ):
        fam = static_gauge(snap, name, doc, lambda s, a=attr: getattr(s, a))
        if fam is not None:
            yield fam
    replay = counter("gpu_pcie_replay_errors", "PCIe replays (link-level retransmissions) since the driver loaded.")
    for g in readings(snap):
        if g.pcie_replay_total is not None:
            replay.add_metric(gpu_label_values(g), g.pcie_replay_total)
    if replay.samples:
        yield replay

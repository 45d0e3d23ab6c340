"""The MIG collector. No MIG trace exists (MIG mode may not be changed on the lent GPUs), so this test adds
MIG devices, built here, to a real H100 snapshot: it checks the collector's output shape, not NVML."""

from __future__ import annotations

from conftest import render, snapshot, trace
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.model import MigReading


def test_mig_devices_get_memory_and_activity_series() -> None:
    snap = snapshot(trace("h100-compute_bound"), polls=3)
    assert snap.poll is not None
    g = snap.poll.gpus[0]
    snap.poll.gpus[0] = g.model_copy(
        update={
            "mig": [
                MigReading(
                    uuid="MIG-a",
                    gpu_instance_id=1,
                    compute_instance_id=0,
                    memory_total_bytes=10 * 2**30,
                    memory_used_bytes=2**30,
                    gpm={"sm_activity": 0.5, "sm_occupancy": 0.25, "dram_activity": 0.125, "graphics_activity": 0.75},
                ),
                MigReading(uuid="MIG-b", gpu_instance_id=2, memory_total_bytes=10 * 2**30),
            ]
        }
    )
    fams = {f.name: f.samples for f in text_string_to_metric_families(render(snap))}
    used = fams["gpu_mig_memory_used_bytes"]
    assert [(s.labels["mig_uuid"], s.labels["gpu_instance"], s.value) for s in used] == [("MIG-a", "1", 2**30)]
    assert {s.labels["mig_uuid"] for s in fams["gpu_mig_memory_total_bytes"]} == {"MIG-a", "MIG-b"}
    [act] = fams["gpu_mig_sm_activity_ratio"]
    assert act.value == 0.5 and act.labels["compute_instance"] == "0"
    # each GPM activity of a MIG device in its own family, under the device's labels
    for family, value in (("gpu_mig_sm_occupancy_ratio", 0.25), ("gpu_mig_dram_activity_ratio", 0.125),
                          ("gpu_mig_graphics_engine_activity_ratio", 0.75)):  # fmt: skip
        [s] = fams[family]
        assert (s.labels["mig_uuid"], s.value) == ("MIG-a", value), family
    assert "gpu_mig_tensor_activity_ratio" not in fams  # not reported by either device: absent

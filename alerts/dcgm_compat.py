"""Writes alerts/dcgm-compat.rules.yml: optional recording rules that publish the most used dcgm-exporter series
(its 4.8 names, in its units) from gpuwarden's, so a dashboard, autoscaler or FinOps query written for dcgm-exporter
(Grafana dashboard 12239 among them) works unchanged against gpuwarden.

Each series keeps gpuwarden's labels and adds dcgm-exporter's ``UUID``, ``modelName`` and ``Hostname`` (from
``gpu_info``'s ``name`` and ``gpu_devices``' ``nodename``). What cannot be mapped is listed in NOT_MAPPED and in
docs/prometheus.md. Run: python3 alerts/dcgm_compat.py; tests/test_alerts.py checks the committed file is its output
and tests it with promtool (alerts/tests/dcgm-compat.test.yml).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

HERE = Path(__file__).parent
OUT = HERE / "dcgm-compat.rules.yml"

#: dcgm-exporter name -> (gpuwarden expression, what the scale does). Units as dcgm-exporter 4.8 exports them:
#: percent 0-100 for the DEV_*_UTIL fields, MiB for frame buffer, MHz for clocks, millijoules for energy, ratios
#: 0-1 for the PROF fields, bytes per second for PCIe and NVLink throughput.
MAPPED: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_utilization_ratio * 100", "ratio to percent"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gpu_memory_copy_utilization_ratio * 100", "ratio to percent"),
    "DCGM_FI_DEV_ENC_UTIL": ("gpu_encoder_utilization_ratio * 100", "ratio to percent"),
    "DCGM_FI_DEV_FB_USED": ("gpu_memory_used_bytes / 1048576", "bytes to MiB"),
    "DCGM_FI_DEV_FB_FREE": ("gpu_memory_free_bytes / 1048576", "bytes to MiB"),
    "DCGM_FI_DEV_FB_RESERVED": ("gpu_memory_reserved_bytes / 1048576", "bytes to MiB"),
    "DCGM_FI_DEV_GPU_TEMP": ("gpu_temperature_celsius", ""),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gpu_memory_temperature_celsius", ""),
    "DCGM_FI_DEV_POWER_USAGE": ("gpu_power_usage_watts", ""),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("gpu_energy_joules_total * 1000", "joules to millijoules"),
    "DCGM_FI_DEV_SM_CLOCK": ('gpu_clock_hertz{clock="sm"} / 1e6', "hertz to MHz"),
    "DCGM_FI_DEV_MEM_CLOCK": ('gpu_clock_hertz{clock="mem"} / 1e6', "hertz to MHz"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("gpu_pcie_replay_errors_total", ""),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ('gpu_ecc_errors_total{type="corrected", counter="volatile"}', ""),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ('gpu_ecc_errors_total{type="uncorrected", counter="volatile"}', ""),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ('gpu_ecc_errors_total{type="corrected", counter="aggregate"}', ""),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ('gpu_ecc_errors_total{type="uncorrected", counter="aggregate"}', ""),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ('gpu_remapped_rows_total{type="corrected"}', ""),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ('gpu_remapped_rows_total{type="uncorrected"}', ""),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gpu_row_remap_failure", ""),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gpu_graphics_engine_activity_ratio", ""),
    "DCGM_FI_PROF_SM_ACTIVE": ("gpu_sm_activity_ratio", ""),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("gpu_sm_occupancy_ratio", ""),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gpu_tensor_activity_ratio", ""),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gpu_dram_activity_ratio", ""),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("gpu_pcie_transmit_bytes_per_second", ""),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("gpu_pcie_receive_bytes_per_second", ""),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("gpu_nvlink_transmit_bytes_per_second", ""),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("gpu_nvlink_receive_bytes_per_second", ""),
}

#: dcgm-exporter series with no faithful gpuwarden equivalent, and why (docs/prometheus.md repeats this).
NOT_MAPPED: dict[str, str] = {
    "DCGM_FI_DEV_XID_ERRORS": "the last XID as a gauge value; gpuwarden counts each XID (gpu_xid_errors_total{xid})",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "a bitmask; gpuwarden exports each reason (gpu_clock_event_reason_active)",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE / FP32 / FP16": "gpuwarden reads the FP pipes together (gpu_pipe_activity_ratio)",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "a counter of bytes; gpuwarden exports rates per direction",
    "dcgm-exporter 4.9 names": "not mapped yet: the 4.9 renames to DCGM 4.7 names are not in this file",
}

#: dcgm-exporter's own labels, joined on: UUID (gpuwarden's uuid), modelName (gpu_info's name), Hostname (the node).
LABELS = (
    " * on (instance, job, gpu, uuid) group_left (modelName) label_replace(group by (instance, job, gpu, uuid, name) "
    '(gpu_info), "modelName", "$1", "name", "(.+)")'
    " * on (instance, job) group_left (Hostname) label_replace(group by (instance, job, nodename) (gpu_devices), "
    '"Hostname", "$1", "nodename", "(.+)")'
)


def rules() -> dict[str, object]:
    """The rule file as a mapping: one recording group, one rule per MAPPED name."""
    out = []
    for name, (expr, _) in MAPPED.items():
        series = f'label_replace({expr}, "UUID", "$1", "uuid", "(.+)")'
        out.append({"record": name, "expr": f"({series}){LABELS}"})
    return {"groups": [{"name": "gpuwarden.dcgm-compat", "interval": "30s", "rules": out}]}


def render() -> str:
    """The file's text: a header naming the source, then the rules."""
    head = (
        "# Generated by alerts/dcgm_compat.py: dcgm-exporter 4.8 series from gpuwarden's, for dashboards and tools\n"
        "# written for dcgm-exporter (optional; load it beside gpuwarden.rules.yml). Not mapped: see the script.\n"
    )
    return head + yaml.safe_dump(rules(), sort_keys=False, width=200)


if __name__ == "__main__":
    OUT.write_text(render())
    sys.exit(0)

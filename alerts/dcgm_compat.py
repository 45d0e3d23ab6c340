"""Writes gpuwarden/mixin/dcgm-compat.rules.yml: optional recording rules that publish the most used dcgm-exporter
series from gpuwarden's, so a dashboard, autoscaler or FinOps query written for dcgm-exporter (Grafana dashboard 12239
among them) works unchanged against gpuwarden. Two groups: the 4.8 names in 4.8's units (MAPPED), and the names
dcgm-exporter 4.9 exports since DCGM 4.7 deprecated the old ones, in base units (MAPPED_49). Drop the group a site
does not need.

Each series keeps gpuwarden's GPU labels (instance, job, gpu, uuid, and the labels its selector names) and adds
dcgm-exporter's: ``UUID``, ``modelName``, ``pci_bus_id``, ``device`` (``nvidia<minor>``), ``DCGM_FI_DRIVER_VERSION``,
``namespace``/``pod``/``container`` where the kubelet assigned the GPU, and its host label (``gpu_devices``'
``nodename``): ``Hostname`` up to 4.8.2, ``hostname`` from 4.8.3 on, so the 4.8 group carries both and the 4.9 group
``hostname``. The labels are joined once per evaluation into one series per GPU (LABELS_RULE), so each mapped series
costs one join. What cannot be mapped is listed in NOT_MAPPED and
NOT_MAPPED_49, and in docs/prometheus.md. Run: python3 alerts/dcgm_compat.py; tests/test_alerts.py checks the
committed file is its output and tests it with promtool (alerts/tests/dcgm-compat.test.yml).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).parent
OUT = HERE.parent / "gpuwarden" / "mixin" / "dcgm-compat.rules.yml"

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
    "DCGM_FI_DEV_MEM_CLOCK": ('gpu_clock_hertz{clock="memory"} / 1e6', "hertz to MHz"),
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
}

#: dcgm-exporter 4.9 name -> (gpuwarden expression, unit). The names are DCGM's current field names as go-dcgm's
#: field table lists them (the old name marked deprecated, pointing at the new one; base-unit fields 1603, 1604, 1611
#: with their own IDs), plus DCGM_FI_DEV_FB_CAPACITY_BYTES, which 4.9 collects by default. Base units throughout:
#: hertz, joules, 0-1 ratios, bytes; so most are gpuwarden's series as they are. Names whose meaning did not change
#: (ECC totals, the PROF PCIe and NVLink rates) keep their 4.8 names and are in the 4.8 group only.
MAPPED_49: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_SM_CLOCK_HERTZ": ('gpu_clock_hertz{clock="sm"}', "hertz"),
    "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ": ('gpu_clock_hertz{clock="memory"}', "hertz"),
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": ("gpu_temperature_celsius", "degrees Celsius"),
    "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS": ("gpu_memory_temperature_celsius", "degrees Celsius"),
    "DCGM_FI_DEV_BOARD_POWER_WATTS": ("gpu_power_usage_watts", "watts"),
    "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": ("gpu_energy_joules_total", "joules"),
    "DCGM_FI_DEV_GPU_UTIL_RATIO": ("gpu_utilization_ratio", "ratio"),
    "DCGM_FI_DEV_FB_CAPACITY_BYTES": ("gpu_memory_total_bytes", "bytes"),
    "DCGM_FI_DEV_PCIE_REPLAY_TOTAL": ("gpu_pcie_replay_errors_total", "count"),
    "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL": ('gpu_remapped_rows_total{type="corrected"}', "count"),
    "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL": ('gpu_remapped_rows_total{type="uncorrected"}', "count"),
    "DCGM_FI_DEV_ROW_REMAP_FAILED": ("gpu_row_remap_failure", "0 or 1"),
    "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO": ("gpu_graphics_engine_activity_ratio", "ratio"),
    "DCGM_FI_PROF_SM_UTIL_RATIO": ("gpu_sm_activity_ratio", "ratio"),
    "DCGM_FI_PROF_SM_OCCUPANCY_RATIO": ("gpu_sm_occupancy_ratio", "ratio"),
    "DCGM_FI_PROF_TENSOR_UTIL_RATIO": ("gpu_tensor_activity_ratio", "ratio"),
    "DCGM_FI_PROF_DRAM_UTIL_RATIO": ("gpu_dram_activity_ratio", "ratio"),
}

#: 4.9 series left out of MAPPED_49, and why (docs/prometheus.md repeats this).
NOT_MAPPED_49: dict[str, str] = {
    "frame buffer free/used/reserved, copy/encoder/decoder utilization": (
        "4.9 moves them to bytes and ratios under DCGM 4.7 names that go-dcgm's published field table does not list "
        "yet; rather than guess a name, only their 4.8 names (MiB, percent) are published"
    ),
    "DCGM_FI_DEV_XID_ERROR": "the last XID as a gauge value, as in 4.8",
    "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL": "a counter of bytes; gpuwarden exports rates per direction",
    "DCGM_FI_PROF_FP64/FP32/FP16_UTIL_RATIO": "gpuwarden reads the FP pipes together (gpu_pipe_activity_ratio)",
}


#: The recording rule, one per group, holding each GPU's dcgm-exporter labels (value 1; one series per Kubernetes
#: container the GPU is assigned to, as dcgm-exporter repeats a shared GPU's series per pod).
LABELS_RULE = "instance_gpu:dcgm_exporter_labels:info"


def _labels_rule(hosts: tuple[str, ...]) -> str:
    """The expression of LABELS_RULE: per GPU, dcgm-exporter's labels from gpuwarden's info series - ``UUID``,
    ``modelName`` (gpu_info's name), ``pci_bus_id``, ``device`` (``nvidia`` + the minor number, its /dev node),
    ``DCGM_FI_DRIVER_VERSION`` (gpu_driver_info), each of ``hosts`` (gpu_devices' nodename) - and ``namespace``,
    ``pod`` and ``container`` where the kubelet assigned the GPU (gpu_pod_info). Every other label of the GPU's
    series is kept (the target's ``cluster``, ``node``, ...: a dashboard selects by them), so ``without``, not
    ``by``."""
    gpu = "group without (serial, vbios_version, architecture, compute_capability) (gpu_info)"
    for new, old, fmt in (("UUID", "uuid", "$1"), ("modelName", "name", "$1"), ("device", "minor_number", "nvidia$1")):
        gpu = f'label_replace({gpu}, "{new}", "{fmt}", "{old}", "(.+)")'
    node = "group by (instance, job, nodename) (gpu_devices)"
    for host in hosts:
        node = f'label_replace({node}, "{host}", "$1", "nodename", "(.+)")'
    driver = (
        'label_replace(group by (instance, job, driver_version) (gpu_driver_info), "DCGM_FI_DRIVER_VERSION", "$1", '
        '"driver_version", "(.+)")'
    )
    added = ", ".join(["UUID", "modelName", "pci_bus_id", "device", "DCGM_FI_DRIVER_VERSION", *hosts])
    joined = f"{gpu} * on (instance, job) group_left ({', '.join(hosts)}) {node}"
    joined += f" * on (instance, job) group_left (DCGM_FI_DRIVER_VERSION) {driver}"
    base = f"group without (name, minor_number) ({joined})"
    pods = "group without (device_id, resource) (gpu_pod_info)"
    return (
        f"({pods} * on (instance, job, gpu, uuid) group_left ({added}) {base}) or on (instance, job, gpu, uuid) {base}"
    )


def _group(name: str, mapped: dict[str, tuple[str, str]], hosts: tuple[str, ...]) -> dict[str, object]:
    """One recording group: LABELS_RULE first (evaluated once, read by every rule after it in the same evaluation),
    then a rule per mapped name: the GPU's labels of LABELS_RULE with the gpuwarden series' value and the labels its
    matchers name (``clock``, ``type``, ``counter``)."""
    labels_rule = LABELS_RULE if name.endswith("compat") else LABELS_RULE.replace(":info", "_49:info")
    out: list[dict[str, str]] = [{"record": labels_rule, "expr": _labels_rule(hosts)}]
    for record, (expr, _) in mapped.items():
        named = ", ".join(re.findall(r"(\w+)=", expr))
        out.append({"record": record, "expr": f"{labels_rule} * on (instance, job, gpu, uuid) group_left ({named}) "
                                              f"({expr})"})  # fmt: skip
    return {"name": name, "interval": "30s", "rules": out}


def rules() -> dict[str, object]:
    """The rule file as a mapping: the 4.8 group (MAPPED; Hostname and hostname) and the 4.9 group (MAPPED_49;
    hostname)."""
    return {
        "groups": [
            _group("gpuwarden.dcgm-compat", MAPPED, ("Hostname", "hostname")),
            _group("gpuwarden.dcgm-compat-4.9", MAPPED_49, ("hostname",)),
        ]
    }


def render() -> str:
    """The file's text: a header naming the source, then the rules."""
    head = (
        "# Generated by alerts/dcgm_compat.py: dcgm-exporter series from gpuwarden's, for dashboards and tools\n"
        "# written for dcgm-exporter (optional; load it beside gpuwarden.rules.yml). Group gpuwarden.dcgm-compat:\n"
        "# the 4.8 names and units; group gpuwarden.dcgm-compat-4.9: the 4.9 names, base units. Not mapped: see\n"
        "# the script.\n"
    )
    return head + yaml.safe_dump(rules(), sort_keys=False, width=200)


if __name__ == "__main__":
    OUT.write_text(render())
    sys.exit(0)

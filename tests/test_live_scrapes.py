"""Scrapes taken from `gpuwarden serve` on real NVML (tests/data/scrapes, see tests/data/README.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

SCRAPES = sorted((Path(__file__).parent / "data" / "scrapes").glob("*.txt"))

# What every live scrape of a Hopper GPU must show (issue 2's list of families).
REQUIRED = {
    "gpu_info", "gpu_up", "gpu_utilization_ratio", "gpu_memory_copy_utilization_ratio", "gpu_memory_total_bytes",
    "gpu_memory_used_bytes", "gpu_memory_free_bytes", "gpu_memory_reserved_bytes", "gpu_temperature_celsius",
    "gpu_memory_temperature_celsius", "gpu_temperature_threshold_celsius", "gpu_power_usage_watts",
    "gpu_power_limit_watts", "gpu_energy_joules", "gpu_clock_hertz", "gpu_clock_max_hertz",
    "gpu_clock_event_reason_active", "gpu_clock_event_reason_seconds", "gpu_performance_state",
    "gpu_pcie_link_generation", "gpu_pcie_link_width", "gpu_pcie_receive_bytes_per_second",
    "gpu_pcie_transmit_bytes_per_second", "gpu_sm_activity_ratio", "gpu_sm_occupancy_ratio",
    "gpu_tensor_activity_ratio", "gpu_dram_activity_ratio", "gpu_pipe_activity_ratio", "gpu_ecc_errors",
    "gpu_remapped_rows", "gpu_row_remap_pending", "gpu_row_remap_failure", "gpu_xid_errors", "gpu_compute_processes",
    "gpu_process_memory_used_bytes", "gpu_mig_mode_enabled", "gpuwarden_build_info", "gpuwarden_poll_duration_seconds",
    "gpuwarden_last_poll_success_timestamp_seconds", "gpuwarden_nvml_errors",
}  # fmt: skip


def fams(path: Path) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(path.read_text())}


def test_there_are_live_scrapes() -> None:
    assert SCRAPES, "no scrape recorded on a real GPU"


@pytest.mark.parametrize("path", SCRAPES, ids=[p.stem for p in SCRAPES])
def test_live_scrape_has_every_family(path: Path) -> None:
    f = fams(path)
    missing = REQUIRED - set(f)
    assert not missing, missing
    names = {s.labels["name"] for s in f["gpu_info"]}
    assert names <= {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    # every GPU was up and polled
    assert all(s.value == 1 for s in f["gpu_up"])
    assert f["gpuwarden_poll_duration_seconds"][0].value < 1.0


@pytest.mark.e2e
@pytest.mark.parametrize("path", SCRAPES, ids=[p.stem for p in SCRAPES])
def test_live_scrape_passes_promtool(path: Path, promtool: str) -> None:
    res = subprocess.run(
        [promtool, "check", "metrics"], input=path.read_text(), capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


def test_ddp_scrape_shows_the_waiting_gpu() -> None:
    f = fams(Path(__file__).parent / "data" / "scrapes" / "h200x2-ddp_straggler.txt")
    util = {s.labels["gpu"]: s.value for s in f["gpu_utilization_ratio"]}
    sm = {s.labels["gpu"]: s.value for s in f["gpu_sm_activity_ratio"]}
    assert util["0"] > 0.9 and sm["0"] < 0.5  # busy by util.gpu, mostly idle SMs: waiting in the all-reduce
    assert {s.labels["gpu"] for s in f["gpu_nvlink_receive_bytes_per_second"]} == {"0", "1"}


def test_compute_bound_scrape_shows_a_busy_power_capped_gpu() -> None:
    f = fams(Path(__file__).parent / "data" / "scrapes" / "h100-compute_bound.txt")

    def one(name: str, **labels: str) -> float:
        [s] = [s for s in f[name] if all(s.labels.get(k) == v for k, v in labels.items())]
        return s.value

    assert one("gpu_utilization_ratio") > 0.95
    assert one("gpu_sm_activity_ratio") > 0.9 and one("gpu_tensor_activity_ratio") > 0.9
    assert one("gpu_clock_event_reason_active", reason="sw_power_cap") == 1
    assert one("gpu_power_usage_watts") > 0.95 * one("gpu_power_limit_watts")
    node_level = ("gpu_driver_info", "gpu_count")
    series_per_gpu = sum(len(v) for k, v in f.items() if k.startswith("gpu_") and k not in node_level)
    assert series_per_gpu <= 120


LIVE = Path(__file__).parent / "data" / "live"


def _diag(name: str) -> dict:
    import json

    return json.loads((LIVE / f"{name}.diagnosis.json").read_text())


def test_live_starved_dataloader_is_starved_and_attributed() -> None:
    f = fams(Path(__file__).parent / "data" / "scrapes" / "h100-starved_dataloader.txt")
    [ratio] = f["gpu_starved_ratio"]
    assert ratio.value > 0.5
    assert [s.labels["reason"] for s in f["gpu_diagnosis"] if s.value == 1] == ["input_starved"]
    [job] = f["gpu_process_job_info"]
    # recorded before the labels were renamed from job to job_id (a job label clashes with Prometheus's own) and from
    # command to process_name (the name gpu_process_memory_used_bytes uses)
    name = job.labels.get("process_name", job.labels.get("command"))
    assert name == "python3" and (job.labels.get("job_id") or job.labels.get("job"))
    [gpu] = _diag("h100-starved_dataloader")["gpus"]
    assert gpu["diagnosis"]["verdict"] == "input_starved" and gpu["starved_ratio"] > 0.5


def test_live_compute_bound_is_not_starved() -> None:
    f = fams(Path(__file__).parent / "data" / "scrapes" / "h100-compute_bound.txt")
    [ratio] = f["gpu_starved_ratio"]
    assert ratio.value < 0.1
    assert {s.labels["reason"] for s in f["gpu_diagnosis"] if s.value == 1} == {"compute_bound", "throttled"}


def test_live_ddp_straggler_names_the_waiting_gpu_and_the_straggler() -> None:
    f = fams(Path(__file__).parent / "data" / "scrapes" / "h200x2-ddp_straggler.txt")
    verdicts = {s.labels["gpu"]: s.labels["reason"] for s in f["gpu_diagnosis"] if s.value == 1}
    assert verdicts == {"0": "waiting_on_peers", "1": "input_starved"}
    [node] = f["gpu_node_imbalance_ratio"]
    assert node.value > 0.5
    gpus = {g["gpu"]: g["diagnosis"] for g in _diag("h200x2-ddp_straggler")["gpus"]}
    assert "GPU 1" in gpus[0]["summary"] and "straggler" in gpus[0]["summary"]

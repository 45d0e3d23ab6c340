"""docs/metrics.md is what the code exports: regenerate it and compare."""

from __future__ import annotations

from pathlib import Path

from exporter.metrics_doc import reference, reference_snapshots

DOC = Path(__file__).parent.parent / "docs" / "metrics.md"


def test_metrics_reference_matches_the_code() -> None:
    expected = reference(reference_snapshots())
    assert DOC.read_text() == expected, (
        "docs/metrics.md is stale: run python3 -m exporter.metrics_doc > docs/metrics.md"
    )


def test_reference_lists_the_issue_families() -> None:
    text = DOC.read_text()
    for name in [
        "gpu_info",
        "gpu_up",
        "gpu_utilization_ratio",
        "gpu_memory_reserved_bytes",
        "gpu_temperature_celsius",
        "gpu_memory_temperature_celsius",
        "gpu_temperature_threshold_celsius",
        "gpu_power_usage_watts",
        "gpu_power_limit_watts",
        "gpu_energy_joules_total",
        "gpu_clock_hertz",
        "gpu_clock_max_hertz",
        "gpu_clock_event_reason_active",
        "gpu_clock_event_reason_seconds_total",
        "gpu_performance_state",
        "gpu_pcie_link_generation",
        "gpu_pcie_receive_bytes_per_second",
        "gpu_sm_activity_ratio",
        "gpu_sm_occupancy_ratio",
        "gpu_tensor_activity_ratio",
        "gpu_dram_activity_ratio",
        "gpu_pipe_activity_ratio",
        "gpu_nvlink_receive_bytes_per_second",
        "gpu_ecc_errors_total",
        "gpu_remapped_rows_total",
        "gpu_row_remap_pending",
        "gpu_xid_errors_total",
        "gpu_xid_last_event_timestamp_seconds",
        "gpu_compute_processes",
        "gpu_process_memory_used_bytes",
        "gpu_mig_mode_enabled",
        "gpuwarden_build_info",
        "gpuwarden_poll_duration_seconds",
        "gpuwarden_last_poll_success_timestamp_seconds",
        "gpuwarden_nvml_errors_total",
    ]:
        assert f"| `{name}` |" in text, name


def test_families_without_a_recording_are_really_in_the_collectors() -> None:
    from exporter.metrics_doc import NOT_RECORDED

    src = "".join(p.read_text() for p in (Path(__file__).parent.parent / "exporter" / "collectors").glob("*.py"))
    for name, (_, _, _collector, doc) in NOT_RECORDED.items():
        assert f'"{name}"' in src, name
        assert doc in src, doc

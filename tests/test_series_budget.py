"""The series budget of the default profile (docs/prometheus.md, "What it costs Prometheus"), counted on every shipped
recording: what a GPU costs in Prometheus's head, and the opt-in collectors that bring the rest back.

A GPU's series are those carrying its ``uuid``, less the per-process and per-job families (``gpu_process_*``,
``gpu_job_info``, ``gpu_pod_info``), which ``processes.max_per_gpu`` bounds apart. Counted after the whole recording
(replayed in a loop to its end), so each GPU has been through every state, idle cause and diagnosis its recording
holds: those families have a series per key the GPU has been in since the daemon started.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parent))

from conftest import TRACES, render, replay_poller  # noqa: E402

from gpuwarden.catalog import FAMILIES  # noqa: E402
from gpuwarden.insight.analyzer import InsightAnalyzer  # noqa: E402
from gpuwarden.replay import demo_trace_path  # noqa: E402

#: MetricFamily a GPU at most, all recordings, less each NVLink link's series (link up, and its error counters that
#: counted): 32-43 for most, up to 49 for a GPU whose recording walks through many states and idle causes (each a
#: series once it occurred).
BUDGET = 49
#: Of them, the readings and health series (all but the time accounting and the diagnosis): 38 on h100-stopped (its
#: driver binding reads the recovery action, and says which one reading it lacks: gpu_reading_unsupported).
READINGS_BUDGET = 38
LINKS = ("gpu_nvlink_link_up", "gpu_nvlink_link_errors")
#: An NVLink GPU's series beyond its links': NVLink traffic (GPM), CRC totals, the fabric's state, identity, health.
NVLINK_EXTRA = 8
ACCOUNTING = ("gpu_state_seconds", "gpu_idle_seconds", "gpu_diagnosis")
APART = ("gpu_process_", "gpu_job_info", "gpu_pod_info")
PATHS = [demo_trace_path(), demo_trace_path("faults"), *sorted(TRACES.glob("*.jsonl.gz"))]


def per_gpu(text: str) -> dict[str, collections.Counter[str]]:
    """uuid -> family name -> series, of the GPU families of an exposition (the per-process ones left out)."""
    out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith(APART):
            continue
        for s in fam.samples:
            if "uuid" in s.labels and "gpu" in s.labels:
                out[s.labels["uuid"]][fam.name] += 1
    return out


@pytest.mark.e2e  # every recording replayed to its end (400 polls at most): about 14 s in all
@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_a_gpu_stays_in_the_series_budget(path: Path) -> None:
    poller = replay_poller(path, 400, analyzers={"insight": InsightAnalyzer().prepare})
    assert poller.snapshot is not None
    gpus = per_gpu(render(poller.snapshot))
    assert gpus, "no GPU series"
    for uuid, fams in gpus.items():
        links = sum(fams.get(name, 0) for name in LINKS)
        total = sum(fams.values()) - links
        readings = total - sum(n for name, n in fams.items() if name in ACCOUNTING)
        extra = NVLINK_EXTRA if links else 0
        assert total <= BUDGET + extra, (uuid, total, dict(fams))
        assert readings <= READINGS_BUDGET + extra, (uuid, readings, dict(fams))
        assert fams["gpu_diagnosis"] >= 1  # the verdict is there, as one series per reason that holds


def test_a_reason_a_code_or_a_counter_that_never_occurred_has_no_series() -> None:
    poller = replay_poller(TRACES / "h100-idle.jsonl.gz", 60, analyzers={"insight": InsightAnalyzer().prepare})
    assert poller.snapshot is not None
    text = render(poller.snapshot)
    fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
    assert [s.labels["reason"] for s in fams["gpu_diagnosis"]] == ["free"]
    assert {s.labels["state"] for s in fams["gpu_state_seconds"]} == {"free"}
    assert {s.labels["cause"] for s in fams["gpu_idle_seconds"]} == {"free"}
    assert "gpu_xid_errors" not in fams and "gpu_peer_wait_seconds" not in fams
    assert all(s.value > 0 for name in ("gpu_state_seconds", "gpu_idle_seconds") for s in fams[name])


def test_the_opt_in_collectors_bring_back_every_other_family() -> None:
    poller = replay_poller(TRACES / "h100-compute_bound.jsonl.gz", 40, analyzers={"insight": InsightAnalyzer().prepare})
    assert poller.snapshot is not None
    default = {f.name for f in text_string_to_metric_families(render(poller.snapshot))}
    full = {f.name for f in text_string_to_metric_families(render(poller.snapshot, enable=("detail", "idle_energy")))}
    opt_in = {f.base_name for f in FAMILIES if f.collector in ("detail", "idle_energy")}
    assert opt_in.isdisjoint(default)
    # what this H100 recording answers: clock limits, P-state, pipes, PCIe generations, memory free and reserved,
    # the default power limit, ECC and MIG mode, remapped rows, energy by idle cause
    for name in ("gpu_power_default_limit_watts", "gpu_clock_max_hertz", "gpu_performance_state",
                 "gpu_graphics_engine_activity_ratio", "gpu_pipe_activity_ratio", "gpu_pcie_link_generation",
                 "gpu_pcie_link_max_generation", "gpu_memory_free_bytes", "gpu_memory_reserved_bytes",
                 "gpu_ecc_enabled", "gpu_mig_mode_enabled",
                 "gpu_remapped_rows_total", "gpu_idle_energy_joules_total", "gpu_held_idle_energy_joules_total",
                 "gpu_peer_wait_energy_joules_total"):  # fmt: skip
        base = name.removesuffix("_total")  # the parser names a counter's family without it
        assert base in full and base not in default, name

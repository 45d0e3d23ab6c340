"""The insight collector over real traces: names, bounded labels, values from the analysis, no NaN."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_insight_helpers import DDP, h100, run_trace, snap_of

from gpuwarden.collectors import CollectOptions
from gpuwarden.exposition import Exposition
from gpuwarden.insight.reasons import REASONS
from gpuwarden.insight.vocabulary.states import STATES
from gpuwarden.snapshot import Held


def scrape(path, opts: CollectOptions | None = None, polls: int | None = None) -> dict[str, list]:  # noqa: ANN001
    static, trace_polls, results = run_trace(path)
    n = len(trace_polls) if polls is None else polls
    snap = snap_of(static, trace_polls[n - 1], results[n - 1])
    text = Exposition(Held(snap), ["insight"], opts or CollectOptions()).render().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_h100_starved_dataloader_families() -> None:
    fams = scrape(h100("starved_dataloader"))
    states = {s.labels["state"]: s.value for s in fams["gpu_state_seconds"]}
    assert set(states) == {"busy", "starved"} < set(STATES)  # a state the GPU was never in has no series
    assert states["starved"] > states["busy"] > 0
    (ratio,) = fams["gpu_starved_ratio"]
    assert ratio.value > 0.5
    diag = {s.labels["reason"]: s.value for s in fams["gpu_diagnosis"]}
    assert diag == {"input_starved": 1.0}  # the verdict alone: the other reasons have no series
    assert set(diag) < set(REASONS)
    (info,) = fams["gpu_process_job_info"]
    assert info.labels["job_kind"] == "cgroup" and info.labels["pid"] == "702"
    assert info.labels["process_name"] == "python3" and info.labels["job_scope"] == "node"
    assert "gpu_node_imbalance_ratio" not in fams and "gpu_job_imbalance_ratio" not in fams


def test_no_sample_is_nan_and_diagnosis_absent_before_history() -> None:
    fams = scrape(h100("compute_bound"), polls=1)
    assert "gpu_diagnosis" not in fams
    for samples in fams.values():
        assert all(not math.isnan(s.value) for s in samples)


def test_ddp_job_and_node_imbalance_and_process_bound() -> None:
    if not DDP.exists():
        pytest.skip("2xH200 ddp_straggler trace not recorded")
    fams = scrape(DDP)
    (node,) = fams["gpu_node_imbalance_ratio"]
    (job,) = fams["gpu_job_imbalance_ratio"]
    assert 0.3 < node.value <= 1 and job.value == pytest.approx(node.value)
    assert len(fams["gpu_process_job_info"]) == 3
    bounded = scrape(DDP, CollectOptions(max_processes_per_gpu=1))
    assert sorted(s.labels["gpu"] for s in bounded["gpu_process_job_info"]) == ["0", "1"]
    # GPU 0 keeps its largest process (rank 0, 607), not the launcher's 0.5 GB context
    assert {s.labels["pid"] for s in bounded["gpu_process_job_info"] if s.labels["gpu"] == "0"} == {"607"}
    diag = {(s.labels["gpu"], s.labels["reason"]): s.value for s in fams["gpu_diagnosis"]}
    assert diag[("0", "waiting_on_peers")] == 1.0 and diag[("1", "input_starved")] == 1.0

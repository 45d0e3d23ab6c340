"""/api/v1/idleness (gpuwarden.web.idleness): active, idle with its cause and for how long, or unknown, per GPU
and per job, on real recordings: a GPU whose job waits on its input is active (the mean-utilization trap a culler
falls into), a held-idle one and one allocated and never opened are idle, and an allocated job using one of its two
GPUs is active."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TRACES
from fastapi.testclient import TestClient

from gpuwarden.allocation import JobMapping
from gpuwarden.config import load_config
from gpuwarden.daemon import Daemon
from gpuwarden.insight.analyzer import InsightAnalyzer
from gpuwarden.insight.vocabulary.result import GpuInsight, StateRun
from gpuwarden.poller import Poller
from gpuwarden.replay import ReplaySource
from gpuwarden.web.idleness import gpu_status, idleness_document


def _document(name: str, polls: int = 30, annotate: object = None) -> dict:
    source = ReplaySource(TRACES / f"{name}.jsonl.gz", timing="recorded", annotate=annotate)  # type: ignore[arg-type]
    poller = Poller(source, 1.0, analyzers={"insight": InsightAnalyzer().prepare})
    poller.start(thread=False)
    for _ in range(polls - 1):
        poller.poll_once()
    assert poller.snapshot is not None
    return idleness_document(poller.snapshot).model_dump()


def test_a_gpu_is_active_idle_or_unknown_by_its_latest_interval() -> None:
    """Busy, starved and paused are in use; held_idle, allocated_idle and free are idle since the run began;
    unknown, lost and no interval yet are unknown (a caller treats them as active)."""

    def gpu(state: str | None, since: float | None = None) -> GpuInsight:
        runs = [] if state is None else [StateRun(state="busy", start=0, end=50), StateRun(state=state, start=50,
                                                                                           end=100)]  # fmt: skip
        return GpuInsight(gpu=0, uuid="GPU-a", state_seconds_total={}, window_state_seconds={}, state_runs=runs,
                          idle_since=since)  # fmt: skip

    assert gpu_status(gpu("starved"), 100) == ("active", None, None)
    assert gpu_status(gpu("paused"), 100) == ("active", None, None)
    assert gpu_status(gpu("allocated_idle", 40.0), 100) == ("idle", "allocated_idle", 60.0)
    assert gpu_status(gpu("unknown"), 100) == ("unknown", None, None)
    assert gpu_status(gpu("lost"), 100) == ("unknown", None, None)
    assert gpu_status(gpu(None), 100) == ("unknown", None, None)


@pytest.mark.parametrize(
    ("name", "status", "cause"),
    [("h100-starved_dataloader", "active", None), ("h100-compute_bound", "active", None),
     ("h100-held_idle", "idle", "held_idle"), ("h100-idle", "idle", "free")],
)  # fmt: skip
def test_real_recordings_read_as_their_workloads_did(name: str, status: str, cause: str | None) -> None:
    doc = _document(name)
    [g] = doc["gpus"]
    assert doc["available"] and doc["unknown_means"] == "active"
    assert (g["status"], g["cause"]) == (status, cause)
    if status == "idle":
        assert 20 < g["idle_seconds"] <= 30  # idle since the first accounted interval, 29 polls of a second


def test_a_job_allocated_two_gpus_using_one_is_active_and_its_untouched_gpu_idle(tmp_path: Path) -> None:
    """The 2-GPU H100 recording (bf16 products on GPU 0, nothing on GPU 1) with both GPUs allocated to job 777: GPU 1
    is idle (allocated_idle), GPU 0 active, and job 777, which holds both, active."""
    for n in (0, 1):
        (tmp_path / str(n)).write_text("777\n")
    doc = _document("h100x2-one-of-two", annotate=JobMapping(tmp_path).assign)
    gpus = {g["gpu"]: g for g in doc["gpus"]}
    assert (gpus[0]["status"], gpus[1]["status"], gpus[1]["cause"]) == ("active", "idle", "allocated_idle")
    assert ("slurm", "777") in gpus[1]["jobs"]
    jobs = {j["job_id"]: j for j in doc["jobs"]}
    assert jobs["777"]["status"] == "active" and jobs["777"]["gpus"] == [0, 1]


def test_the_daemon_serves_it_and_says_when_it_has_nothing() -> None:
    cfg = load_config(overrides={"listen_address": "127.0.0.1:0", "replay": TRACES / "h100-held_idle.jsonl.gz"})
    d = Daemon(cfg)
    client = TestClient(d.app)
    first = client.get("/api/v1/idleness")
    assert first.status_code == 503 or first.json()["available"] is False
    d.poller.start(thread=False)
    for _ in range(5):
        d.poller.poll_once()
    doc = client.get("/api/v1/idleness").json()
    assert doc["available"] and doc["gpus"][0]["status"] == "idle" and doc["gpus"][0]["cause"] == "held_idle"
    assert "/api/v1/idleness" in client.get("/openapi.json").json()["paths"]
    d.poller.stop()

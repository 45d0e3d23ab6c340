"""Verdicts on the recordings of the workload kinds (tools/workloads.py, recorded on an H100 with
tools/device-record-kinds.sh; provenance in tests/data/README.md): each names its cause, including variants of a
kind recorded with other knobs than the one a rule was first checked on."""

from __future__ import annotations

import pytest
from conftest import TRACES

from gpuwarden.commands.diagnose import replay_report
from gpuwarden.insight.vocabulary.result import InsightResult

#: trace -> (verdict, findings that must be there too)
EXPECTED = {
    "h100-k-launch-bound": ("launch_bound", ()),
    "h100-k-launch-bound-size-65536": ("launch_bound", ()),
    "h100-k-loader-workers-workers-8": ("input_starved", ()),
    "h100-k-loader-workers-workers-3": ("input_starved", ()),
    "h100-k-self-paused": ("job_paused", ()),
    "h100-k-self-paused-busy-2-pause-3": ("job_paused", ()),
    "h100-k-d2d-copy": ("memory_bound", ()),
    "h100-k-elementwise": ("memory_bound", ()),
    "h100-k-fp32-matmul": ("compute_bound", ("tensor_cores_idle",)),
    "h100-k-io-reader": ("input_starved", ()),
    # the host works on the GPU's output: an optimizer stepped on the CPU (gradients out, parameters back) and
    # metrics computed on the host (outputs out, nothing in), each at two sizes
    "h100-k-host-optimizer-size-2048": ("host_compute_bound", ()),
    "h100-k-host-optimizer-size-8192": ("host_compute_bound", ()),
    "h100-k-host-metrics-size-2048": ("host_compute_bound", ()),
    "h100-k-host-metrics-size-8192": ("host_compute_bound", ()),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_kind_gets_its_verdict(name: str) -> None:
    verdict, findings = EXPECTED[name]
    report = replay_report(TRACES / f"{name}.jsonl.gz")
    [gpu] = report.diagnosis.gpus
    assert gpu.diagnosis is not None
    assert gpu.diagnosis.verdict == verdict, gpu.diagnosis.summary
    assert set(findings) <= set(gpu.diagnosis.findings)


def test_input_bound_says_which_input() -> None:
    """CPU preprocessing in worker processes and waiting on storage are told apart in the summary."""
    workers = replay_report(TRACES / "h100-k-loader-workers-workers-8.jsonl.gz").diagnosis.gpus[0].diagnosis
    storage = replay_report(TRACES / "h100-k-io-reader.jsonl.gz").diagnosis.gpus[0].diagnosis
    assert workers is not None and storage is not None
    assert "helper processes" in workers.summary
    assert "from storage" in storage.summary


def test_launch_bound_remedies_are_launch_remedies() -> None:
    d = replay_report(TRACES / "h100-k-launch-bound.jsonl.gz").diagnosis.gpus[0].diagnosis
    assert d is not None and any("CUDA Graphs" in r for r in d.remedies)
    assert not any("DataLoader" in r for r in d.remedies)


@pytest.mark.parametrize(
    ("name", "cause"),
    [
        ("h100-k-loader-workers-workers-8", "input_cpu"),
        ("h100-k-io-reader", "input_io"),
        ("h100-k-self-paused-busy-2-pause-3", "paused"),
        ("h100-held_idle", "held_idle"),
        ("h100-idle", "free"),
    ],
)
def test_idle_time_by_cause_adds_up_to_wall_time(name: str, cause: str) -> None:
    """Busy seconds plus idle seconds by cause equal the accounted seconds, and the kind's own cause leads."""
    from gpuwarden.insight.analyzer import InsightAnalyzer, insight_result
    from gpuwarden.trace import read_trace

    header, polls = read_trace(TRACES / f"{name}.jsonl.gz")
    analyzer = InsightAnalyzer()
    result = None
    for poll in polls:
        result = insight_result(analyzer(poll, header.node))
    assert result is not None
    [gpu] = result.gpus
    idle = gpu.idle_seconds_total
    wall = sum(gpu.state_seconds_total.values())
    assert wall > 10
    assert gpu.state_seconds_total["busy"] + sum(idle.values()) == pytest.approx(wall)
    assert max(idle, key=lambda k: idle[k]) == cause


HEALTH = TRACES / "derived-h100-health.jsonl.gz"
HEALTH_FINDINGS = {"hot", "uncorrectable_ecc", "xid_errors", "row_remap_pending"}


def test_health_trace_is_what_its_script_writes_and_says_it_is_modified(tmp_path) -> None:  # noqa: ANN001
    import importlib.util
    from pathlib import Path

    from gpuwarden.trace import read_trace

    script = Path(__file__).parent / "data" / "make_health_trace.py"
    spec = importlib.util.spec_from_file_location("make_health_trace", script)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(tmp_path / "t.jsonl.gz")
    made, committed = read_trace(tmp_path / "t.jsonl.gz"), read_trace(HEALTH)
    assert made[0].metadata == committed[0].metadata and made[1] == committed[1]
    assert "modified" in committed[0].metadata


def test_api_shows_the_health_findings() -> None:
    from conftest import replay_poller
    from fastapi.testclient import TestClient

    from gpuwarden.catalog import select_collectors
    from gpuwarden.collectors import CollectOptions
    from gpuwarden.exposition import Exposition
    from gpuwarden.insight.analyzer import InsightAnalyzer
    from gpuwarden.web.app import create_app, diagnosis_route

    p = replay_poller(HEALTH, 20, analyzers={"insight": InsightAnalyzer().prepare})
    app = create_app(p, Exposition(p, select_collectors(), CollectOptions()), 1e9, [diagnosis_route(p)])
    body = TestClient(app).get("/api/v1/diagnosis").json()
    [gpu] = body["gpus"]
    d = gpu["diagnosis"]
    assert d["verdict"] == "compute_bound" and d["severity"] == "critical"
    assert HEALTH_FINDINGS <= set(d["findings"])
    assert "87 °C" in d["summary"] and "XID 63" in d["summary"]
    assert d["remedies"][0].startswith("Uncorrectable memory errors")  # critical findings' remedies first


@pytest.mark.e2e
def test_diagnose_cli_shows_the_health_findings() -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "diagnose", "--replay", str(HEALTH)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "uncorrectable ECC" in text and "XID 63" in text and "row remap is pending" in text


@pytest.mark.parametrize(
    ("cgroup", "cores"),
    [
        ("/kubepods/besteffort/pod0d5b8f64-4b8e-4c55-b1c4-6a3a7d2e9f10/" + "a" * 64, 3.0),  # the pod is the job
        ("/process_api/fde5bbd3c99aa4299964ce61c78d37a5", None),  # a runner's cgroup: the process tree counts
    ],
)
def test_job_cpu_is_the_cgroups_where_the_cgroup_is_the_job(cgroup: str, cores: float | None) -> None:
    """A Kubernetes pod's CPU is its cgroup's (3 cores here, whatever its GPU process's tree reads); a cgroup that
    is not a job (it may hold unrelated processes) leaves the process and its DataLoader workers as the job's CPU."""
    from gpuwarden.insight.analyzer import InsightAnalyzer, insight_result
    from gpuwarden.trace import read_trace

    header, polls = read_trace(TRACES / "h100-k-loader-workers-workers-8.jsonl.gz")
    analyzer = InsightAnalyzer()
    t0 = polls[0].timestamp
    result = None
    for poll in polls:
        g = poll.gpus[0]
        procs = [
            p.model_copy(update={"cgroup": cgroup, "cgroup_cpu_seconds_total": 100.0 + 3.0 * (poll.timestamp - t0)})
            for p in g.processes or ()
        ]
        poll = poll.model_copy(update={"gpus": [g.model_copy(update={"processes": procs})]})
        result = insight_result(analyzer(poll, header.node))
    assert result is not None and result.gpus[0].diagnosis is not None
    evidence = {e.name: e.value for e in result.gpus[0].diagnosis.evidence}
    if cores is not None:
        assert evidence["job_cpu"] == pytest.approx(cores, rel=0.02)
    else:
        assert evidence["job_cpu"] > 6  # eight workers' CPU, not the cgroup's 3 cores


def test_a_lost_gpu_is_diagnosed_lost() -> None:
    """GPU 1 of the DDP recording falls off the bus at poll 10: its diagnosis is gpu_lost (critical), the other
    GPU keeps its own."""
    from gpuwarden.insight.analyzer import InsightAnalyzer, insight_result
    from gpuwarden.trace import read_trace

    header, polls = read_trace(TRACES / "h200x2-ddp_straggler.jsonl.gz")
    analyzer = InsightAnalyzer()
    result = None
    for n, poll in enumerate(polls[:15]):
        if n >= 10:
            g0, g1 = poll.gpus
            g1 = type(g1)(index=g1.index, uuid=g1.uuid, timestamp=g1.timestamp, up=False, error="gpu_is_lost")
            poll = poll.model_copy(update={"gpus": [g0, g1]})
        result = insight_result(analyzer(poll, header.node))
    assert result is not None
    d0, d1 = (g.diagnosis for g in result.gpus)
    assert d1 is not None and d1.verdict == "gpu_lost" and d1.severity == "critical" and "gpu_is_lost" in d1.summary
    assert d0 is not None and d0.verdict != "gpu_lost"


@pytest.mark.parametrize("down", [range(10, 15), range(5, 8), range(3, 24)])
def test_a_flapping_gpu_counts_its_time_down_as_lost_and_nothing_else(down: range) -> None:
    """GPU 1 of the DDP recording is down for the polls in ``down``, then back: every second between the poll before
    it went down and the last down poll is ``lost`` (state and idle cause), none of it grows another state, and the
    states still add up to the wall time since the GPU's first poll."""
    from gpuwarden.insight.analyzer import InsightAnalyzer, insight_result
    from gpuwarden.trace import read_trace

    header, polls = read_trace(TRACES / "h200x2-ddp_straggler.jsonl.gz")
    polls = polls[: down.stop + 5]
    analyzer, clean = InsightAnalyzer(), InsightAnalyzer()
    result = reference = None
    for n, poll in enumerate(polls):
        reference = insight_result(clean(poll, header.node))
        if n in down:
            r0, r1 = poll.gpus
            r1 = type(r1)(index=r1.index, uuid=r1.uuid, timestamp=r1.timestamp, up=False, error="gpu_is_lost")
            poll = poll.model_copy(update={"gpus": [r0, r1]})
        result = insight_result(analyzer(poll, header.node))
    assert result is not None and reference is not None
    g1, ref1 = result.gpus[1], reference.gpus[1]
    went_down = polls[down.start - 1].gpus[1].timestamp
    lost = polls[down.stop - 1].gpus[1].timestamp - went_down
    assert g1.state_seconds_total["lost"] == pytest.approx(lost)
    assert g1.idle_seconds_total["lost"] == pytest.approx(lost)
    wall = polls[-1].gpus[1].timestamp - polls[0].gpus[1].timestamp
    assert sum(g1.state_seconds_total.values()) == pytest.approx(wall)
    assert sum(ref1.state_seconds_total.values()) == pytest.approx(wall)
    for state in ("held_idle", "starved", "paused", "unknown", "free"):  # no state grew from the time down
        assert g1.state_seconds_total[state] <= ref1.state_seconds_total[state] + 1e-6
    assert result.gpus[0].state_seconds_total == reference.gpus[0].state_seconds_total


def _replayed_with_powers(name: str) -> tuple[InsightResult, dict[str, tuple[float, float]]]:
    """The InsightResult after the whole recording ``name``, and each GPU's (lowest, highest) power in it."""
    from gpuwarden.insight.analyzer import InsightAnalyzer, insight_result
    from gpuwarden.trace import read_trace

    header, polls = read_trace(TRACES / f"{name}.jsonl.gz")
    analyzer = InsightAnalyzer()
    powers: dict[str, list[float]] = {}
    result = None
    for poll in polls:
        for g in poll.gpus:
            if g.power_usage_watts is not None:
                powers.setdefault(g.uuid, []).append(g.power_usage_watts)
        result = insight_result(analyzer(poll, header.node))
    assert result is not None
    return result, {u: (min(p), max(p)) for u, p in powers.items()}


@pytest.mark.parametrize("name", ["h100-held_idle", "h100-k-self-paused", "h200x2-ddp_straggler"])
def test_held_idle_energy_is_power_above_the_idle_floor_over_held_idle_time(name: str) -> None:
    """The held-idle energy counter is, poll by poll, the held-idle seconds times the power above the lowest power
    seen so far: at most held-idle seconds x (highest - lowest power), zero without held-idle time."""
    result, powers = _replayed_with_powers(name)
    for gpu in result.gpus:
        joules, held = gpu.held_idle_energy_joules_total, gpu.idle_seconds_total["held_idle"]
        assert joules is not None and joules >= 0
        low, high = powers[gpu.uuid]
        assert joules <= held * (high - low) + 1e-9
        if held == 0:
            assert joules == 0
    if name == "h100-held_idle":
        assert result.gpus[0].idle_seconds_total["held_idle"] > 30 and result.gpus[0].held_idle_energy_joules_total > 0


@pytest.mark.parametrize(
    "name",
    ["h100-starved_dataloader", "h100-held_idle", "h100-k-self-paused", "h100-compute_bound", "h200x2-ddp_straggler"],
)
def test_idle_energy_by_cause_is_bounded_by_each_causes_seconds(name: str) -> None:
    """``gpu_idle_energy_joules_total{cause}`` on real recordings: each cause's joules lie between 0 and its idle
    seconds times the GPU's power range (none without seconds), held_idle's equal the held-idle energy family, and
    the starved loader's cost is its input_cpu time."""
    from gpuwarden.insight.vocabulary.states import IDLE_CAUSES

    result, powers = _replayed_with_powers(name)
    for gpu in result.gpus:
        energy = gpu.idle_energy_joules_total
        assert energy is not None and set(energy) <= set(IDLE_CAUSES)
        low, high = powers[gpu.uuid]
        for cause, seconds in gpu.idle_seconds_total.items():
            assert 0 <= energy.get(cause, 0.0) <= seconds * (high - low) + 1e-9, cause
        assert energy["held_idle"] == pytest.approx(gpu.held_idle_energy_joules_total)
    if name == "h100-starved_dataloader":
        energy = result.gpus[0].idle_energy_joules_total
        assert energy is not None and max(energy, key=lambda c: energy[c]) == "input_cpu" and energy["input_cpu"] > 0

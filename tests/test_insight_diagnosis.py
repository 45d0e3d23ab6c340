"""Verdicts over the real traces: each scenario gets its own, and nothing else is called starved."""

from __future__ import annotations

import pytest
from test_insight_helpers import DDP, h100, run, run_trace

from gpuwarden.insight.diagnosis import diagnose
from gpuwarden.insight.gpu_window import GpuWindow, replaced
from gpuwarden.insight.reasons import REASONS, REMEDIES, SEVERITY
from gpuwarden.trace import read_trace

# ground truth: what each recorded workload (tools/workloads.py) does to the GPU
EXPECTED = {
    "idle": "free",
    "compute_bound": "compute_bound",
    "starved_dataloader": "input_starved",
    "starved_cpu_heavy": "input_starved",
    "h2d_pageable_copy": "h2d_copy_bound",
    "held_idle": "held_idle",
}
STARVED = {"input_starved", "h2d_copy_bound", "waiting_on_peers"}


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_each_h100_scenario_gets_its_verdict_at_the_end_of_its_trace(scenario: str) -> None:
    header, polls = read_trace(h100(scenario))
    assert header.metadata["scenario"] == scenario
    d = run(polls, header.node)[-1].gpus[0].diagnosis
    assert d is not None
    assert d.verdict == EXPECTED[scenario]
    assert d.findings[0] == d.verdict
    assert d.remedies and d.summary and d.evidence


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_the_verdict_is_stable_once_given(scenario: str) -> None:
    _, _, results = run_trace(h100(scenario))
    verdicts = [r.gpus[0].diagnosis.verdict for r in results if r.gpus[0].diagnosis is not None]
    assert len(verdicts) >= len(results) - 3
    assert set(verdicts) == {EXPECTED[scenario]}


@pytest.mark.parametrize("scenario", ["compute_bound", "idle"])
def test_compute_bound_and_idle_are_never_called_starved(scenario: str) -> None:
    _, _, results = run_trace(h100(scenario))
    for r in results:
        d = r.gpus[0].diagnosis
        assert d is None or not STARVED & set(d.findings)
        assert r.gpus[0].starved_ratio is None or r.gpus[0].starved_ratio < 0.05


def test_compute_bound_power_cap_is_an_info_finding_not_a_fault() -> None:
    d = run_trace(h100("compute_bound"))[2][-1].gpus[0].diagnosis
    assert d.findings == ["compute_bound", "throttled"]
    assert d.severity == "info"
    ev = {e.name: e.value for e in d.evidence}
    assert ev["sm_clock_of_max"] < 0.9 and ev["throttle_share"] > 0.9
    assert ev["sm_activity"] > 0.9


def test_evidence_numbers_match_the_trace() -> None:
    header, polls = read_trace(h100("h2d_pageable_copy"))
    d = run(polls, header.node)[-1].gpus[0].diagnosis
    ev = {e.name: e.value for e in d.evidence}
    rx = [p.gpus[0].gpm["pcie_rx_bytes_per_second"] for p in polls[1:]]
    assert ev["pcie_rx"] == pytest.approx(sum(rx) / len(rx), rel=0.05)
    assert ev["job_cpu"] == pytest.approx(1.0, abs=0.05)
    assert ev["sm_activity"] < 0.01


def test_ddp_straggler_waiting_rank_and_straggling_rank() -> None:
    if not DDP.exists():
        pytest.skip("2xH200 ddp_straggler trace not recorded")
    _, polls, results = run_trace(DDP)
    by_gpu = {g.gpu: g for g in results[-1].gpus}
    d0, d1 = by_gpu[0].diagnosis, by_gpu[1].diagnosis
    assert d0.verdict == "waiting_on_peers"
    assert "GPU 1" in d0.summary
    assert d1.verdict == "input_starved"
    assert "Straggler" in d1.summary
    # rank 0 reads util.gpu ~99% yet it is not called compute_bound anywhere in its steady state
    assert all(r.gpus[0].diagnosis.verdict != "compute_bound" for r in results if r.gpus[0].diagnosis)


def _variant(scenario: str, gpu_update) -> tuple:  # noqa: ANN001
    header, polls = read_trace(h100(scenario))
    changed = [p.model_copy(update={"gpus": [gpu_update(g) for g in p.gpus]}) for p in polls]
    return header.node, changed


def test_launch_bound_when_sms_are_nearly_empty_under_full_util() -> None:
    # the real compute_bound trace with GPM SM activity cut to a tenth: "utilized" but SMs nearly empty
    static, polls = _variant(
        "compute_bound",
        lambda g: g.model_copy(update={"gpm": {**g.gpm, "sm_activity": g.gpm.get("sm_activity", 0) / 10}}),
    )
    d = run(polls, static)[-1].gpus[0].diagnosis
    assert d.verdict == "launch_bound"


def test_thermal_slowdown_under_load_is_the_verdict() -> None:
    static, polls = _variant("compute_bound", lambda g: g.model_copy(update={"clock_event_reasons": 0x40}))
    d = run(polls, static)[-1].gpus[0].diagnosis
    assert d.verdict == "throttled" and d.severity == "warning"
    assert "hw_thermal_slowdown" in d.summary


def test_memory_nearly_full_is_an_extra_finding() -> None:
    static, polls = _variant(
        "held_idle", lambda g: g.model_copy(update={"memory_used_bytes": int(g.memory_total_bytes * 0.95)})
    )
    d = run(polls, static)[-1].gpus[0].diagnosis
    assert d.verdict == "held_idle" and "memory_nearly_full" in d.findings


def test_no_verdict_before_two_seconds_of_history() -> None:
    header, polls = read_trace(h100("compute_bound"))
    results = run(polls[:2], header.node)
    assert all(g.diagnosis is None for r in results for g in r.gpus)


def test_the_reason_table_gives_each_reason_severity_remedies_and_each_verdict_a_rule() -> None:
    from gpuwarden.insight.reasons import REASON_TABLE, VERDICT_ORDER, VERDICT_RULES
    from gpuwarden.insight.rules import RULES

    assert len(REASONS) == len(set(REASONS)) == len(REASON_TABLE)
    assert all(SEVERITY[r] in ("ok", "info", "warning", "critical") and REMEDIES[r] for r in REASONS)
    assert len(VERDICT_ORDER) == len(set(VERDICT_ORDER)), "each verdict is tried once"
    assert set(VERDICT_ORDER) == set(RULES) and set(VERDICT_ORDER) <= set(REASONS), "each verdict has one rule"
    # only the last rule holds unconditionally: every GPU gets a verdict, and no rule after it is dead
    assert [n for n, r in VERDICT_RULES if r.when is None] == [VERDICT_ORDER[-1]] == ["underutilized"]


def test_underutilized_when_no_rule_holds() -> None:
    w = GpuWindow(
        index=0,
        uuid="GPU-x",
        seconds=10.0,
        states={"busy": 3.0, "starved": 1.0, "paused": 1.0, "held_idle": 4.0, "free": 0.0, "unknown": 1.0},
        held=True,
        util=0.3,
        sm=0.3,
        job_cpu_cores=0.5,
    )
    assert diagnose(w).verdict == "underutilized"


def _busy(index: int, util: float, sm: float) -> GpuWindow:
    return GpuWindow(
        index=index,
        uuid=f"GPU-{index}",
        seconds=60.0,
        states={"busy": 60.0 * util, "starved": 60.0 * (1 - util)},
        held=True,
        util=util,
        sm=sm,
        job_cpu_cores=1.0,
        max_process_cpu_cores=1.0,
    )


def test_gpu_side_straggler_is_named_and_its_peer_waits() -> None:
    """One rank given 4x the GPU work: it computes (SM 0.95) while the other spins in all-reduce (util.gpu 0.9-0.98,
    SM 0.24-0.39): the waiter is waiting_on_peers naming the straggler, which gets the straggler finding."""
    for waiter_util, waiter_sm in ((0.9, 0.24), (0.98, 0.39), (0.78, 0.39)):
        waiter, straggler = _busy(0, waiter_util, waiter_sm), _busy(1, 0.99, 0.95)
        d = diagnose(waiter, [straggler])
        assert d is not None and d.verdict == "waiting_on_peers", (waiter_util, waiter_sm, d)
        assert "GPU 1" in d.summary and "GPU-side" in d.summary
        s = diagnose(straggler, [waiter])
        assert s is not None and s.verdict == "compute_bound" and "straggler" in s.findings


def test_balanced_ranks_wait_on_nobody() -> None:
    a, b = _busy(0, 0.95, 0.9), _busy(1, 0.96, 0.92)
    for w, peer in ((a, b), (b, a)):
        d = diagnose(w, [peer])
        assert d is not None and d.verdict == "compute_bound" and "straggler" not in d.findings


def test_launch_bound_at_low_utilization_needs_a_busy_launching_thread() -> None:
    w = _busy(0, 0.28, 0.0)
    d = diagnose(w)
    assert d is not None and d.verdict == "launch_bound"
    quiet = GpuWindow(**{**w.__dict__, "max_process_cpu_cores": 0.1, "job_cpu_cores": 0.1})
    d = diagnose(quiet)
    assert d is not None and d.verdict != "launch_bound"


def test_input_bound_at_forty_percent_starved_is_not_compute_bound() -> None:
    """A loader with many workers that cannot keep up: util.gpu 0.6, SM 0.58, GPU idle 40% while the workers work."""
    w = GpuWindow(
        index=0,
        uuid="GPU-0",
        seconds=60.0,
        states={"busy": 36.0, "starved": 24.0},
        held=True,
        util=0.6,
        sm=0.58,
        job_cpu_cores=9.0,
        max_process_cpu_cores=0.4,
    )
    d = diagnose(w)
    assert d is not None and d.verdict == "input_starved" and "helper processes" in d.summary


def test_pausing_job_seen_live_with_pause_edges_misplaced() -> None:
    """Live, at a 1 s poll, util.gpu is a short sample: a job computing 2 s and sleeping 2 s read starved 24% and
    paused 24% (H100, serve). Its CPU (0.54 cores) is what its GPU-busy share (53%) explains: the job pauses."""
    w = GpuWindow(
        index=0,
        uuid="GPU-0",
        seconds=30.0,
        states={"busy": 15.9, "starved": 7.2, "paused": 7.2},
        held=True,
        util=0.53,
        sm=0.41,
        tensor=0.4,
        dram=0.12,
        job_cpu_cores=0.54,
        max_process_cpu_cores=0.54,
    )
    d = diagnose(w)
    assert d is not None and d.verdict == "job_paused"
    loader = GpuWindow(**{**w.__dict__, "job_cpu_cores": 1.0, "max_process_cpu_cores": 1.0})
    d = diagnose(loader)
    assert d is not None and d.verdict == "input_starved"


def test_every_declared_mean_is_a_window_reading_and_undeclared_ones_are_refused() -> None:
    import dataclasses

    from gpuwarden.insight.evidence import EVIDENCE, MEANS, pack_means

    fields = {f.name: f.type for f in dataclasses.fields(GpuWindow)}
    for m in MEANS:
        assert fields.get(m.name) == "float | None", m
    names = [e.evidence for e in EVIDENCE]
    assert len(names) == len(set(names))
    values = {m.name: float(i) for i, m in enumerate(MEANS)}
    assert pack_means(**values) == tuple(float(i) for i in range(len(MEANS)))
    with pytest.raises(KeyError, match="not declared in MEANS"):
        pack_means(**values, gpu_temperature=1.0)
    with pytest.raises(KeyError):
        pack_means(**{k: v for k, v in values.items() if k != "sm"})


def _host_side(idle: float, job_cpu: float, rx: float | None, tx: float | None, paused: float = 0.0) -> GpuWindow:
    """A held GPU idle ``idle`` of a minute (starved, or ``paused``), its job on ``job_cpu`` cores, PCIe as given."""
    return GpuWindow(
        index=0,
        uuid="GPU-h",
        seconds=60.0,
        states={"busy": 60.0 * (1 - idle), "starved": 60.0 * (idle - paused), "paused": 60.0 * paused},
        held=True,
        util=1 - idle,
        sm=(1 - idle) * 0.8,
        job_cpu_cores=job_cpu,
        max_process_cpu_cores=min(job_cpu, 1.0),
        pcie_rx=rx,
        pcie_tx=tx,
    )


@pytest.mark.parametrize(
    ("idle", "cores", "rx", "tx"),
    [
        (0.6, 1.0, 2.0e9, 2.1e9),  # a CPU-stepped optimizer: gradients out, parameters back (TX about RX)
        (0.8, 4.0, 6.0e9, 6.0e9),  # a larger model, a multi-threaded host step
        (0.3, 1.0, 0.3e9, 0.35e9),  # a small model, a short host step
        (0.5, 1.0, 0.01e9, 1.2e9),  # metrics on the host: outputs copied out, nothing in
    ],
)
def test_host_work_on_the_gpus_output_is_host_compute_bound(idle: float, cores: float, rx: float, tx: float) -> None:
    d = diagnose(_host_side(idle, cores, rx, tx))
    assert d is not None and d.verdict == "host_compute_bound", d
    assert {e.name for e in d.evidence} >= {"pcie_rx", "pcie_tx"} and d.severity == "warning"
    assert "optimizer" in d.remedies[0]


@pytest.mark.parametrize(
    ("idle", "cores", "rx", "tx", "paused", "expected"),
    [
        # a loader: input flows in, little comes out (the loader recordings: 0.03-0.32 GB/s in; at several GB/s an idle
        # second the copies themselves fill the idle time: h2d_copy_bound, test_copies_beside_compute_...)
        (0.6, 4.0, 0.3e9, 0.05e9, 0.0, "input_starved"),
        (0.6, 4.0, 0.3e9, 0.25e9, 0.0, "input_starved"),  # more in than out: input
        (0.6, 4.0, 0.01e9, 0.05e9, 0.0, "input_starved"),  # out > in but a trickle: the direction says nothing
        (0.6, 4.0, None, None, 0.0, "input_starved"),  # no GPM (pre-Hopper): cannot tell, the input rule stands
        (0.7, 0.02, 0.2e9, 0.4e9, 0.7, "job_paused"),  # the job's CPU idles too: a pause, whatever the copies
    ],
)
def test_without_more_out_than_in_the_input_rule_stands(
    idle: float, cores: float, rx: float | None, tx: float | None, paused: float, expected: str
) -> None:
    d = diagnose(_host_side(idle, cores, rx, tx, paused))
    assert d is not None and d.verdict == expected, d


@pytest.mark.parametrize(
    ("idle", "sm", "rx", "expected"),
    [
        (0.5, 0.35, 4.0e9, "h2d_copy_bound"),  # pageable copies between steps: 8 GB/s an idle second
        (0.3, 0.58, 2.4e9, "h2d_copy_bound"),  # the same with longer steps between them
        (0.6, 0.30, 1.2e9, "input_starved"),  # 2.0 GB/s an idle second: under 2 GiB/s, input
        (0.5, 0.35, 0.9e9, "input_starved"),  # under 1 GiB/s in all: input, whatever the idle share
        (0.2, 0.70, 2.0e9, "compute_bound"),  # idle under a quarter of the time: the GPU mostly works
    ],
)
def test_copies_beside_compute_are_h2d_copy_bound_whatever_the_sms_do_between_them(
    idle: float, sm: float, rx: float, expected: str
) -> None:
    """At a quarter of the time idle or more, PCIe RX per idle second >= 2 GiB/s (the copy_compute recordings: 7.8-8.4
    GB/s; loaders 0.03-0.47) makes the verdict h2d_copy_bound, with SMs active between the copies."""
    d = diagnose(replaced(_host_side(idle, 1.0, rx, 0.05 * rx), "sm", sm))
    assert d is not None and d.verdict == expected, d
    if expected == "h2d_copy_bound":
        assert "copies fill the idle time" in d.summary and "pin_memory" in d.remedies[0]


def _idle_job(**over: object) -> GpuWindow:
    """A held GPU busy 20% of a minute whose job's one process uses 0.3 cores: what the I/O rules tell apart."""
    base: dict[str, object] = dict(
        index=0,
        uuid="GPU-0",
        seconds=60.0,
        states={"busy": 12.0, "starved": 48.0},
        held=True,
        util=0.2,
        sm=0.19,
        pcie_rx=1e6,
        pcie_tx=1e6,
        job_cpu_cores=0.3,
        max_process_cpu_cores=0.3,
        io_read_bytes_per_second=0.0,
        io_other_read_bytes_per_second=0.0,
        io_write_bytes_per_second=0.0,
        voluntary_switches_per_second=2.0,
    )
    base.update(over)
    return GpuWindow(**base)  # type: ignore[arg-type]


def test_a_job_writing_while_its_gpu_idles_is_checkpoint_bound_not_waiting_on_storage() -> None:
    d = diagnose(_idle_job(io_write_bytes_per_second=200e6, io_blocked_processes=1.0, pcie_tx=4e8))
    assert d is not None and d.verdict == "checkpoint_bound", d
    assert "writes 200 MB/s" in d.summary and "asynchronous" in d.remedies[0]
    # reading more than it writes: input from storage, as before
    d = diagnose(_idle_job(io_write_bytes_per_second=20e6, io_read_bytes_per_second=400e6))
    assert d is not None and d.verdict == "input_starved" and "from storage" in d.summary
    # writes below the bound say nothing
    d = diagnose(_idle_job(io_write_bytes_per_second=1e6, states={"busy": 12.0, "paused": 48.0}, job_cpu_cores=0.2))
    assert d is not None and d.verdict == "job_paused"


def test_reads_other_than_from_storage_are_remote_input() -> None:
    d = diagnose(_idle_job(io_other_read_bytes_per_second=50e6, job_cpu_cores=0.2))
    assert d is not None and d.verdict == "input_starved" and "remote storage" in d.summary, d


def test_many_short_waits_are_input_and_a_quiet_pause_is_a_pause() -> None:
    """The same CPU and bytes: a job that waits 2,000 times a second is fetching (socket reads are in no counter);
    one that waits twice a second pauses."""
    waiting = diagnose(_idle_job(voluntary_switches_per_second=2000.0, job_cpu_cores=0.1))
    assert waiting is not None and waiting.verdict == "input_starved" and "many short waits" in waiting.summary
    pausing = diagnose(_idle_job(job_cpu_cores=0.1, states={"busy": 12.0, "paused": 48.0}))
    assert pausing is not None and pausing.verdict == "job_paused"
    # a GPU whose kernels run under 1% of the time while the job waits on sockets is not "nobody uses it"
    slow = _idle_job(util=0.002, sm=0.002, states={"busy": 0.1, "starved": 59.9}, voluntary_switches_per_second=70.0)
    d = diagnose(GpuWindow(**{**slow.__dict__, "job_cpu_cores": 0.05, "max_process_cpu_cores": 0.05}))
    assert d is not None and d.verdict == "input_starved", d


def test_mid_size_kernels_with_short_gaps_and_one_busy_thread_are_launch_bound() -> None:
    """Kernels covering 45% of the SMs while they run, the GPU idle half the time in gaps inside sample periods."""
    w = _idle_job(util=0.5, sm=0.225, states={"busy": 30.0, "starved": 30.0}, whole_idle_ratio=0.0)
    w = GpuWindow(**{**w.__dict__, "job_cpu_cores": 1.0, "max_process_cpu_cores": 1.0})
    d = diagnose(w)
    assert d is not None and d.verdict == "launch_bound" and "profiler" in d.summary, d
    # the idle time in whole sample periods with no kernel: gaps longer than a launch, input between steps
    d = diagnose(GpuWindow(**{**w.__dict__, "whole_idle_ratio": 0.4}))
    assert d is not None and d.verdict == "input_starved"
    # the job's CPU in helper processes: a DataLoader's workers
    d = diagnose(GpuWindow(**{**w.__dict__, "job_cpu_cores": 6.0}))
    assert d is not None and d.verdict == "input_starved"
    # kernels that fill the GPU (a training step) with the same gaps: input, not launches
    d = diagnose(GpuWindow(**{**w.__dict__, "sm": 0.45}))
    assert d is not None and d.verdict == "input_starved"


def _server(busy: float, listening: float | None, idle_state: str = "paused", **over: object) -> GpuWindow:
    """A held GPU busy ``busy`` of a minute, the rest in ``idle_state``, its job's process listening (on average)
    ``listening`` of the window on a port of its own, 2 GB held, its CPU quiet."""
    w = GpuWindow(
        index=0,
        uuid="GPU-s",
        seconds=60.0,
        states={"busy": 60.0 * busy, idle_state: 60.0 * (1 - busy)},
        held=True,
        util=busy,
        sm=busy * 0.9,
        job_cpu_cores=0.05,
        max_process_cpu_cores=0.05,
        listening_processes=listening,
        memory_used_bytes=20 * 10**9,
        memory_total_bytes=80 * 10**9,
    )
    for name, value in over.items():
        w = replaced(w, name, value)
    return w


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        (_server(0.05, 1.0), "serving"),  # sparse requests: the GPU a few percent busy, the job paused between them
        (_server(0.0, 1.0, "held_idle"), "serving"),  # no request for a while: a server, not "nobody uses it"
        (_server(0.4, 0.6), "serving"),  # listening most of the window, busy under half of it
        (_server(0.05, 0.0), "job_paused"),  # no port of its own: a training job's pause (or a notebook kernel's)
        (_server(0.0, 0.0, "held_idle"), "held_idle"),
        (_server(0.05, None), "job_paused"),  # not read (a recording from before, no access to its descriptors)
        (_server(0.0, 1.0, "held_idle", stopped_processes=1.0), "held_idle"),  # stopped: named as stopped
    ],
)
def test_a_server_waiting_for_requests_is_serving(window: GpuWindow, expected: str) -> None:
    d = diagnose(window)
    assert d is not None and d.verdict == expected, d
    if expected == "serving":
        assert "A server waiting for requests" in d.summary and "Size the server" in d.remedies[0]
        assert d.value("job_processes_listening") == window.listening_processes


def test_a_busy_server_is_judged_by_what_limits_its_kernels() -> None:
    d = diagnose(_server(0.9, 1.0, tensor=0.6))
    assert d is not None and d.verdict != "serving", d


@pytest.mark.parametrize(
    ("idle", "verdict", "finding"),
    [
        (0.15, "compute_bound", True),  # a host phase of 15%: named with its share, the verdict unmoved
        (0.05, "compute_bound", False),  # the gaps between steps
        (0.30, "input_starved", False),  # past the starved line: the phase is the verdict
    ],
)
def test_a_host_phase_under_the_starved_line_is_a_finding_with_its_share(
    idle: float, verdict: str, finding: bool
) -> None:
    w = replaced(replaced(_host_side(idle, 1.0, 0.02e9, 0.01e9), "tensor", 0.6), "sm", 0.9 * (1 - idle))
    d = diagnose(w)
    assert d is not None and d.verdict == verdict, d
    assert ("host_phase" in d.findings) is finding, d.findings
    if finding:
        assert f"GPU idles {idle:.0%} of the time while its job works on the host" in d.summary
        assert any("on the host between GPU phases" in r for r in d.remedies)

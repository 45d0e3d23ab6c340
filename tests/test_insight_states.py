"""Time accounting over the real H100 traces: every second lands in one state, and the right one."""

from __future__ import annotations

import pytest
from test_insight_helpers import h100, run, run_trace

from gpuwarden.insight.vocabulary.states import STATES, Segment, account, holder_of, segments
from gpuwarden.trace import read_trace

SCENARIOS = ["idle", "compute_bound", "starved_dataloader", "starved_cpu_heavy", "h2d_pageable_copy", "held_idle"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_states_add_up_to_the_wall_time_between_first_and_last_poll(scenario: str) -> None:
    static, polls, results = run_trace(h100(scenario))
    total = sum(results[-1].gpus[0].state_seconds_total.values())
    assert total == pytest.approx(polls[-1].gpus[0].timestamp - polls[0].gpus[0].timestamp, rel=1e-6)
    assert set(results[-1].gpus[0].state_seconds_total) == set(STATES)


def test_busy_seconds_equal_the_integral_of_the_utilization_samples() -> None:
    static, polls, results = run_trace(h100("starved_dataloader"))
    busy = results[-1].gpus[0].state_seconds_total["busy"]
    mean_util = sum(v for p in polls[1:] for _, v in p.gpus[0].utilization_samples) / sum(
        len(p.gpus[0].utilization_samples) for p in polls[1:]
    )
    span = polls[-1].timestamp - polls[0].timestamp
    assert busy == pytest.approx(mean_util * span, rel=0.1)


def test_idle_gpu_is_free_all_the_time_and_never_starved() -> None:
    _, _, results = run_trace(h100("idle"))
    for r in results:
        s = r.gpus[0].state_seconds_total
        assert s["starved"] == 0 and s["held_idle"] == 0
    assert results[-1].gpus[0].starved_ratio == 0.0


def test_compute_bound_is_busy_and_barely_starved() -> None:
    _, _, results = run_trace(h100("compute_bound"))
    g = results[-1].gpus[0]
    assert g.state_seconds_total["busy"] / sum(g.state_seconds_total.values()) > 0.95
    assert g.starved_ratio is not None and g.starved_ratio < 0.05


@pytest.mark.parametrize("scenario", ["starved_dataloader", "starved_cpu_heavy", "h2d_pageable_copy"])
def test_starved_scenarios_are_mostly_starved(scenario: str) -> None:
    _, _, results = run_trace(h100(scenario))
    assert results[-1].gpus[0].starved_ratio > 0.5


def test_held_idle_is_held_idle_not_starved() -> None:
    _, _, results = run_trace(h100("held_idle"))
    s = results[-1].gpus[0].window_state_seconds
    assert s["held_idle"] / sum(s.values()) > 0.9
    assert results[-1].gpus[0].starved_ratio < 0.05


def test_without_visible_process_cpu_a_held_idle_gpu_is_unknown_not_held_idle() -> None:
    header, polls = read_trace(h100("held_idle"))
    hidden = [
        p.model_copy(
            update={
                "gpus": [
                    g.model_copy(
                        update={"processes": [q.model_copy(update={"cpu_seconds_total": None}) for q in g.processes]}
                    )
                    for g in p.gpus
                ]
            }
        )
        for p in polls
    ]
    s = run(hidden, header.node)[-1].gpus[0].state_seconds_total
    assert s["held_idle"] == 0 and s["unknown"] > 0.9 * sum(s.values())


def test_process_list_off_with_memory_used_is_unknown_and_with_none_used_is_free() -> None:
    header, polls = read_trace(h100("held_idle"))
    off = [p.model_copy(update={"gpus": [g.model_copy(update={"processes": None}) for g in p.gpus]}) for p in polls]
    s = run(off, header.node)[-1].gpus[0].state_seconds_total
    assert s["unknown"] > 0.9 * sum(s.values()) and s["free"] == 0
    header, polls = read_trace(h100("idle"))
    off = [p.model_copy(update={"gpus": [g.model_copy(update={"processes": None}) for g in p.gpus]}) for p in polls]
    s = run(off, header.node)[-1].gpus[0].state_seconds_total
    assert s["free"] == pytest.approx(sum(s.values()))


def test_segments_cover_the_interval_exactly_one_equal_share_a_sample() -> None:
    segs = segments(10.0, 11.0, [(10.2, 0.5), (10.6, 0.0), (9.9, 1.0), (11.5, 1.0)], 0.3)
    assert sum(s.seconds for s in segs) == pytest.approx(1.0)
    assert [(s.end, s.seconds, s.util) for s in segs] == [(10.2, 0.5, 0.5), (10.6, 0.5, 0.0)]
    # the busy sample first in the interval weighs what the others do, wherever the poll's phase fell
    late = segments(10.0, 11.0, [(10.01, 0.3), (10.21, 0.0), (10.41, 0.0), (10.61, 0.0), (10.81, 0.07)], None)
    assert sum(s.util * s.seconds for s in late if s.util is not None) == pytest.approx(0.074)
    assert segments(10.0, 11.0, [], 0.3) == [Segment(11.0, 1.0, 0.3)]
    assert segments(10.0, 10.0, [(10.0, 1.0)], 0.3) == []


def test_recent_gpu_work_with_the_job_idle_is_paused_then_held_idle() -> None:
    segs = [Segment(float(t), 1.0, 1.0 if t == 1 else 0.0) for t in range(1, 11)]
    out, last = account(segs, "job", 0.0, None)
    assert last == 1.0
    assert out["busy"] == 1.0
    assert out["paused"] == pytest.approx(5.0)  # t = 2..6 within RECENT_WORK_SECONDS of the work at t = 1
    assert out["starved"] == 0.0
    assert out["held_idle"] == pytest.approx(4.0)


def test_idle_gpu_while_the_job_works_or_reads_is_starved() -> None:
    segs = [Segment(float(t), 1.0, 1.0 if t == 1 else 0.0) for t in range(1, 11)]
    out, _ = account(segs, "job", 2.0, None)
    assert out["starved"] == pytest.approx(9.0) and out["paused"] == 0.0
    out, _ = account(segs, "job", 0.0, None, io_waiting=True)
    assert out["starved"] == pytest.approx(9.0) and out["held_idle"] == 0.0


def test_recent_work_with_unknown_job_cpu_stays_starved() -> None:
    segs = [Segment(float(t), 1.0, 1.0 if t == 1 else 0.0) for t in range(1, 4)]
    out, _ = account(segs, "job", None, None)
    assert out["starved"] == pytest.approx(2.0) and out["paused"] == 0.0


def test_holder() -> None:
    assert holder_of(True, 0, 0, True) == "none"
    assert holder_of(True, 1, 0, True) == "job"
    assert holder_of(True, 0, 60 * 2**30, True) == "invisible"
    assert holder_of(False, 0, None, True) == "invisible"
    assert holder_of(True, 0, 500 * 2**20, False) == "none"  # v1 memory info counts the reserved ~0.5 GB

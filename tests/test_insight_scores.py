"""Imbalance and starved ratio: the formulas' properties, and the DDP straggler trace."""

from __future__ import annotations

import itertools

import pytest
from test_insight_helpers import DDP, h100, run_trace

from gpuwarden.insight.scores import imbalance, starved_ratio


def test_imbalance_bounds_and_extremes() -> None:
    assert imbalance([0.7, 0.7, 0.7]) == 0.0
    assert imbalance([0.9, 0.0, 0.0, 0.0]) == pytest.approx(1.0)
    assert imbalance([0.0, 0.0]) == 0.0
    assert imbalance([0.5]) is None and imbalance([]) is None
    for vals in itertools.product([0.0, 0.1, 0.5, 1.0], repeat=3):
        v = imbalance(list(vals))
        assert 0.0 <= v <= 1.0
        assert v == pytest.approx(imbalance(list(reversed(vals))))


def test_imbalance_grows_as_one_gpu_pulls_ahead() -> None:
    values = [imbalance([a, 0.2]) for a in (0.2, 0.4, 0.8, 1.0)]
    assert values == sorted(values) and values[0] == 0.0


def test_starved_ratio() -> None:
    assert starved_ratio({"busy": 1.0, "starved": 3.0}) == 0.75
    assert starved_ratio({"busy": 0.0, "starved": 0.0}) is None


def test_single_gpu_traces_have_no_imbalance() -> None:
    _, _, results = run_trace(h100("compute_bound"))
    assert results[-1].node_imbalance_ratio is None
    assert all(j.imbalance_ratio is None for j in results[-1].jobs)


def test_ddp_straggler_job_is_imbalanced_on_sm_activity() -> None:
    if not DDP.exists():
        pytest.skip("2xH200 ddp_straggler trace not recorded")
    _, polls, results = run_trace(DDP)
    res = results[-1]
    (job,) = res.jobs
    assert job.activity_source == "sm_activity" and res.node_activity_source == "sm_activity"
    sm = [[p.gpus[i].gpm["sm_activity"] for p in polls[1:]] for i in (0, 1)]
    means = [sum(s) / len(s) for s in sm]
    assert job.imbalance_ratio == pytest.approx(imbalance(means), abs=0.02)
    assert job.imbalance_ratio > 0.3
    assert res.node_imbalance_ratio == pytest.approx(job.imbalance_ratio)
    starved = {g.gpu: g.starved_ratio for g in res.gpus}
    assert starved[1] > 0.8 > 0.3 > starved[0]


def test_one_slow_rank_reads_the_same_among_2_or_8_gpus() -> None:
    two = imbalance([0.95, 0.3])
    eight = imbalance([0.95] * 7 + [0.3])
    assert two == pytest.approx(eight) == pytest.approx(1 - 0.3 / 0.95)
    assert eight > 0.5  # GpuJobImbalanced's line: one slow rank of eight raises it


def test_shortfalls_name_the_lagging_gpu() -> None:
    from gpuwarden.insight.scores import shortfalls

    assert shortfalls([0.9, 0.45, 0.9]) == pytest.approx([0.0, 0.5, 0.0])
    assert shortfalls([0.0, 0.0]) == [0.0, 0.0]
    assert shortfalls([0.5]) is None

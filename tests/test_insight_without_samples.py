"""Why the NVML layer skips the util.gpu sample buffer at polls under 2 s (gpuwarden.nvml.device).

nvmlDeviceGetSamples costs ~2.8 ms of CPU per call on an H100 (docs/bench/h100-nvml-costs.json), the largest
cost of a 1 s poll. The recorded traces were taken at a 1 s poll with the buffer (~5 samples a poll); run
through the insight analyzer with the samples removed, as a 1 s poll now reads them, every GPU keeps its
verdict and its starved ratio moves by at most 0.02.
"""

from __future__ import annotations

import pytest
from conftest import H100_SCENARIOS, trace

from gpuwarden.insight.analyzer import InsightAnalyzer, InsightResult
from gpuwarden.trace import read_trace

TRACES = [f"h100-{s}" for s in H100_SCENARIOS] + ["h200x2-ddp_straggler"]


def _analyse(name: str, strip: bool) -> InsightResult:
    header, polls = read_trace(trace(name))
    analyzer = InsightAnalyzer()
    result = None
    for poll in polls:
        if strip:
            gpus = [g.model_copy(update={"utilization_samples": []}) for g in poll.gpus]
            poll = poll.model_copy(update={"gpus": gpus})
        result = analyzer(poll, header.node)
    assert result is not None
    return result


@pytest.mark.parametrize("name", TRACES)
def test_verdicts_and_starved_ratio_hold_without_the_sample_buffer(name: str) -> None:
    full, stripped = _analyse(name, strip=False), _analyse(name, strip=True)
    assert any(len(g.utilization_samples) >= 3 for p in read_trace(trace(name))[1] for g in p.gpus)
    for a, b in zip(full.gpus, stripped.gpus, strict=True):
        assert a.diagnosis is not None and b.diagnosis is not None
        assert a.diagnosis.verdict == b.diagnosis.verdict
        assert b.starved_ratio == pytest.approx(a.starved_ratio, abs=0.02)


def _held_gpm(polls: list, every: int) -> list:
    """``polls`` with GPM as the live daemon reads it at a 1 s poll and ``gpm_interval_seconds`` = ``every``: a
    computation every ``every`` polls gives the mean of the recorded per-poll values since the previous one, held
    until the next (none before the second sample)."""
    out = []
    held: dict[str, dict[str, float]] = {}
    for i, p in enumerate(polls):
        if i and i % every == 0:
            block = polls[i - every + 1 : i + 1]
            held = {}
            for g in p.gpus:
                keys = set().union(*(q.gpus[g.index].gpm for q in block))
                held[g.uuid] = {
                    k: sum(vals) / len(vals)
                    for k in keys
                    if (vals := [q.gpus[g.index].gpm[k] for q in block if k in q.gpus[g.index].gpm])
                }
        gpus = [g.model_copy(update={"gpm": held.get(g.uuid, {})}) for g in p.gpus]
        out.append(p.model_copy(update={"gpus": gpus}))
    return out


@pytest.mark.parametrize("name", TRACES)
def test_verdicts_and_imbalance_hold_with_gpm_computed_every_10_s(name: str) -> None:
    """The default GPM interval (gpuwarden.nvml.device.GPM_INTERVAL, 10 s; nvmlGpmMetricsGet costs 1.3-2.4 ms of CPU
    a call): every GPU keeps its verdict, and imbalance and SM activity move by at most 0.05."""
    header, polls = read_trace(trace(name))
    assert all(g.index == i for p in polls for i, g in enumerate(p.gpus))
    results = []
    for variant in (polls, _held_gpm(polls, 10)):
        analyzer = InsightAnalyzer()
        for poll in variant:
            result = analyzer(poll, header.node)
        results.append(result)
    every, held = results
    assert every.node_imbalance_ratio is None or held.node_imbalance_ratio == pytest.approx(
        every.node_imbalance_ratio, abs=0.05
    )
    for a, b in zip(every.gpus, held.gpus, strict=True):
        assert a.diagnosis is not None and b.diagnosis is not None
        assert a.diagnosis.verdict == b.diagnosis.verdict
        if a.activity_source == "sm_activity":
            assert b.activity_source == "sm_activity"
            assert b.activity_ratio == pytest.approx(a.activity_ratio, abs=0.05)

"""Why the NVML layer skips the util.gpu sample buffer at polls under 2 s (exporter.nvml.device).

nvmlDeviceGetSamples costs ~2.8 ms of CPU per call on an H100 (docs/bench/h100-nvml-costs.json), the largest
cost of a 1 s poll. The recorded traces were taken at a 1 s poll with the buffer (~5 samples a poll); run
through the insight analyzer with the samples removed, as a 1 s poll now reads them, every GPU keeps its
verdict and its starved ratio moves by at most 0.02.
"""

from __future__ import annotations

import pytest
from conftest import H100_SCENARIOS, trace

from exporter.insight.analyzer import InsightAnalyzer, InsightResult
from exporter.trace import read_trace

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

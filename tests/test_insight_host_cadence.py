"""The live source reads the host's CPU times at most every 5 s (gpuwarden.nvml.source.HOST_MIN_GAP); the insight
analyzer carries the host's busy share over the polls without a host reading. On every recording (taken with a host
reading at each 1 s poll), keeping one host reading in five leaves every verdict as it was and the host CPU
evidence within 0.05 of the full reading."""

from __future__ import annotations

import pytest
from conftest import H100_SCENARIOS, trace

from gpuwarden.insight.analyzer import InsightAnalyzer
from gpuwarden.trace import read_trace

TRACES = [f"h100-{s}" for s in H100_SCENARIOS] + ["h200x2-ddp_straggler"]


def _analyse(name: str, every: int) -> tuple[InsightAnalyzer, object]:
    header, polls = read_trace(trace(name))
    analyzer = InsightAnalyzer()
    result = None
    for i, poll in enumerate(polls):
        if i % every:
            poll = poll.model_copy(update={"host": None})
        result = analyzer(poll, header.node)
    return analyzer, result


@pytest.mark.parametrize("name", TRACES)
def test_one_host_reading_in_five_keeps_verdicts_and_host_evidence(name: str) -> None:
    (fa, full), (sa, sparse) = _analyse(name, 1), _analyse(name, 5)
    assert all(p.host is not None for p in read_trace(trace(name))[1])  # recorded with a host reading every poll
    for a, b in zip(full.gpus, sparse.gpus, strict=True):  # type: ignore[attr-defined]
        assert a.diagnosis is not None and b.diagnosis is not None
        assert a.diagnosis.verdict == b.diagnosis.verdict
    for uuid, state in fa._gpus.items():
        wa = state.diag.window(state.index, uuid, None)
        wb = sa._gpus[uuid].diag.window(state.index, uuid, None)
        assert wa.host_cpu_busy_ratio is not None and wb.host_cpu_busy_ratio is not None
        assert wb.host_cpu_busy_ratio == pytest.approx(wa.host_cpu_busy_ratio, abs=0.05)


def test_without_any_host_reading_the_host_share_is_unknown() -> None:
    header, polls = read_trace(trace("h100-idle"))
    analyzer = InsightAnalyzer()
    for poll in polls:
        analyzer(poll.model_copy(update={"host": None}), header.node)
    state = next(iter(analyzer._gpus.values()))
    assert state.diag.window(state.index, "x", None).host_cpu_busy_ratio is None

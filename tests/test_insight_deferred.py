"""The daemon's insight analyzer (``InsightAnalyzer.prepare``) accounts every poll at once and builds the poll's
InsightResult only when it is first read (``DeferredInsight``): read long after, the result is the one computed at
that poll, and polls nobody reads never build one."""

from __future__ import annotations

import threading

import pytest
from conftest import trace

from gpuwarden.insight import analyzer as an
from gpuwarden.insight.analyzer import DeferredInsight, InsightAnalyzer, InsightResult, insight_result
from gpuwarden.trace import read_trace


@pytest.mark.parametrize("name", ["h200x2-ddp_straggler", "h100-starved_dataloader", "h100-compute_bound"])
def test_a_deferred_result_read_after_later_polls_is_that_of_its_own_poll(name: str) -> None:
    header, polls = read_trace(trace(name))
    eager, lazy = InsightAnalyzer(window_seconds=12.0, diagnosis_seconds=5.0), InsightAnalyzer(12.0, 5.0)
    expected = [eager(p, header.node) for p in polls]
    deferred = [lazy.prepare(p, header.node) for p in polls]  # every poll accounted, none read yet
    got = [d() for d in deferred]  # read at the end, after all the later polls
    assert got == expected
    assert len({r.gpus[0].window_state_seconds["busy"] for r in got}) > 5  # the results do differ from poll to poll


def test_a_result_is_built_once_and_only_when_read(monkeypatch: pytest.MonkeyPatch) -> None:
    header, polls = read_trace(trace("h100-idle"))
    built = []
    real = an.build_core  # type: ignore[attr-defined]  # patched where the analyzer calls it

    def counted(*a):  # noqa: ANN002, ANN202
        built.append(1)
        return real(*a)

    monkeypatch.setattr(an, "build_core", counted)
    analyzer = InsightAnalyzer()
    deferred = [analyzer.prepare(p, header.node) for p in polls]
    assert built == []
    results = []
    threads = [threading.Thread(target=lambda: results.append(deferred[-1]())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1 and all(r is results[0] for r in results)
    assert insight_result(deferred[-1]) is results[0] and isinstance(results[0], InsightResult)
    assert insight_result(results[0]) is results[0] and insight_result(None) is None


def test_the_daemon_stores_a_deferred_result() -> None:
    from gpuwarden.config import Config
    from gpuwarden.daemon import build_analyzers

    header, polls = read_trace(trace("h100-idle"))
    value = build_analyzers(Config())["insight"](polls[0], header.node)
    assert isinstance(value, DeferredInsight)

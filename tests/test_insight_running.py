"""The insight analyzer's running windows (exporter.insight.analyzer._Running) equal the windows recomputed from
scratch (``span_of`` + ``window_of``) at every poll, over real recordings, with windows short enough that
intervals leave them, jobs change, and the sums are rebuilt many times."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import pytest
from conftest import H100_SCENARIOS, trace

from exporter.insight import analyzer as an
from exporter.insight import states as st
from exporter.insight.analyzer import InsightAnalyzer, _Interval
from exporter.insight.attribution import JobRef
from exporter.insight.diagnosis import GpuWindow
from exporter.insight.scores import starved_ratio
from exporter.model import PollResult
from exporter.trace import read_trace


def _mean(pairs: Iterable[tuple[float | None, float]]) -> float | None:
    """Time-weighted mean of (value, seconds) pairs, skipping None values; None when none is known."""
    num = den = 0.0
    for v, w in pairs:
        if v is not None and w > 0:
            num += v * w
            den += w
    return num / den if den > 0 else None


def span_of(intervals: Sequence[_Interval], seconds: float, same_holder: bool) -> list[_Interval]:
    """The trailing intervals within ``seconds`` (and with the latest holder and PIDs if ``same_holder``),
    recomputed from scratch: what the analyzer's running windows must hold."""
    if not intervals:
        return []
    last = intervals[-1]
    horizon = last.end - seconds
    out: list[_Interval] = []
    for iv in reversed(intervals):
        if iv.end - iv.seconds < horizon - 1e-9:
            break
        if same_holder and (iv.holder != last.holder or iv.pids != last.pids):
            break
        out.append(iv)
    out.reverse()
    return out


def window_of(index: int, uuid: str, ivs: list[_Interval], job: JobRef | None) -> GpuWindow:
    """The GpuWindow of ``ivs`` recomputed from scratch: what the running sums must give (the analyzer's
    original computation)."""
    states = dict.fromkeys(st.STATES, 0.0)
    for iv in ivs:
        for k, v in iv.states.items():
            states[k] += v
    seconds = sum(states.values())
    util_secs = sum(iv.util_seconds for iv in ivs)
    last = ivs[-1] if ivs else None
    throttled = [iv for iv in ivs if iv.throttle]
    total = sum(iv.seconds for iv in ivs)
    return GpuWindow(
        index=index,
        uuid=uuid,
        seconds=seconds,
        states=states,
        held=last is not None and last.holder != "none",
        util=states["busy"] / util_secs if util_secs > 0 else None,
        sm=_mean((iv.sm, iv.seconds) for iv in ivs),
        tensor=_mean((iv.tensor, iv.seconds) for iv in ivs),
        pcie_rx=_mean((iv.pcie_rx, iv.seconds) for iv in ivs),
        nvlink_rx=_mean((iv.nvlink_rx, iv.seconds) for iv in ivs),
        job_cpu_cores=_mean((iv.job_cpu, iv.seconds) for iv in ivs),
        max_process_cpu_cores=_mean((iv.max_proc_cpu, iv.seconds) for iv in ivs),
        host_cpu_busy_ratio=_mean((iv.host_busy, iv.seconds) for iv in ivs),
        memory_used_bytes=last.mem_used if last else None,
        memory_total_bytes=last.mem_total if last else None,
        sm_clock_ratio=_mean((iv.clock_ratio, iv.seconds) for iv in throttled),
        throttle_fraction=sum(iv.seconds for iv in throttled) / total if total > 0 else 0.0,
        severe_throttle_fraction=sum(iv.seconds for iv in ivs if iv.severe) / total if total > 0 else 0.0,
        throttle_reasons=tuple(sorted(frozenset().union(*(iv.reasons for iv in throttled)))) if throttled else (),
        power_watts=_mean((iv.power, iv.seconds) for iv in ivs),
        power_limit_watts=last.power_limit if last else None,
        job=job.job if job and last and last.holder == "job" else None,
        job_kind=job.kind if job and last and last.holder == "job" else None,
        processes=tuple(sorted(last.pids)) if last else (),
    )


def _polls(names: list[str]) -> tuple[object, list[PollResult]]:
    """The polls of several one-GPU recordings played one after the other on the same GPU (so the holder and the
    processes change between them), with timestamps shifted to follow on at the recorded 1 s spacing."""
    node = None
    out: list[PollResult] = []
    t = 0.0
    for name in names:
        header, polls = read_trace(trace(name))
        node = node or header.node
        base = polls[0].timestamp
        for p in polls:
            shift = t - base
            gpus = [
                g.model_copy(
                    update={
                        "timestamp": g.timestamp + shift,
                        "uuid": node.gpus[0].uuid,
                        "utilization_samples": [(ts + shift, u) for ts, u in g.utilization_samples],
                    }
                )
                for g in p.gpus
            ]
            out.append(p.model_copy(update={"timestamp": p.timestamp + shift, "gpus": gpus}))
        t = out[-1].timestamp + 1.0
    return node, out


def _same(a: object, b: object) -> None:
    for f in dataclasses.fields(a):  # type: ignore[arg-type]
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, float) and isinstance(y, float):
            assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9), f.name
        elif isinstance(x, dict):
            assert x.keys() == y.keys(), f.name
            for k in x:
                assert math.isclose(x[k], y[k], rel_tol=1e-9, abs_tol=1e-9), (f.name, k)
        else:
            assert x == y, f.name


def _check(node: object, polls: list[PollResult], monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(an, "REBUILD_EVERY", 7)
    a = InsightAnalyzer(window_seconds=12.0, diagnosis_seconds=5.0)
    history: dict[str, list] = {}
    checked = 0
    for poll in polls:
        a(poll, node)  # type: ignore[arg-type]
        for uuid, state in a._gpus.items():
            ivs = history.setdefault(uuid, [])
            newest = state.node.intervals[-1] if state.node.intervals else None
            if newest is not None and (not ivs or ivs[-1] is not newest):
                ivs.append(newest)
            for running, seconds, same in (
                (state.node, a.window_seconds, False),
                (state.job, a.window_seconds, True),
                (state.diag, a.diagnosis_seconds, True),
            ):
                assert list(running.intervals) == span_of(ivs, seconds, same)
                expected = window_of(state.index, uuid, span_of(ivs, seconds, same), None)
                _same(running.window(state.index, uuid, None), expected)
                checked += 1
            assert len(state.node.intervals) <= 14  # bounded by the window, whatever the history
    return checked


def test_running_windows_equal_the_reference_on_the_ddp_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    header, polls = read_trace(trace("h200x2-ddp_straggler"))
    assert _check(header.node, polls, monkeypatch) > 100


def test_running_windows_equal_the_reference_across_job_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    names = [f"h100-{s}" for s in ("compute_bound", "held_idle", "idle", "starved_dataloader")]
    node, polls = _polls(names)
    assert _check(node, polls, monkeypatch) > 300


@pytest.mark.parametrize("scenario", H100_SCENARIOS)
def test_starved_ratio_is_that_of_the_reference_window(scenario: str) -> None:
    header, polls = read_trace(trace(f"h100-{scenario}"))
    a = InsightAnalyzer()
    for poll in polls:
        result = a(poll, header.node)
    state = next(iter(a._gpus.values()))
    ref = window_of(state.index, "x", span_of(list(state.node.intervals), a.window_seconds, False), None)
    expected = starved_ratio(ref.states)
    assert expected is not None and result.gpus[0].starved_ratio == pytest.approx(expected, abs=1e-12)

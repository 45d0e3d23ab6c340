"""The insight analyzer's running windows (gpuwarden.insight.windows.Running) equal the windows recomputed from
scratch (``span_of`` + ``window_of``, the analyzer's original float computation, kept here as the oracle) at
every poll: over real recordings with windows short enough that intervals leave them and jobs change, and over
long synthetic streams (throttling, unknown values, values from 0 to 4e11, gaps). The running sums are exact
integers, so removing what was added restores them bit for bit: a window that holds only zeros reads exactly 0.
A NaN or infinite reading is unknown: it never enters a window (before, one NaN left the sums NaN until the
next rebuild, 1000 removals later)."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterable, Sequence

import pytest
from conftest import H100_SCENARIOS, trace

from gpuwarden.insight import windows as an
from gpuwarden.insight.analyzer import InsightAnalyzer
from gpuwarden.insight.attribution import JobRef
from gpuwarden.insight.evidence import MEANS, pack_means
from gpuwarden.insight.gpu_window import GpuWindow, Health
from gpuwarden.insight.scores import starved_ratio
from gpuwarden.insight.vocabulary import states as st
from gpuwarden.insight.windows import Interval as _Interval
from gpuwarden.model import PollResult
from gpuwarden.trace import read_trace


def _mean(pairs: Iterable[tuple[float | None, float]]) -> float | None:
    """Time-weighted mean of (value, seconds) pairs, skipping None values; None when none is known."""
    num = den = 0.0
    for v, w in pairs:
        if v is not None and w > 0:
            num += v * w
            den += w
    return num / den if den > 0 else None


def span_of(intervals: Sequence[_Interval], seconds: float, same_holder: bool) -> list[_Interval]:
    """The trailing intervals within ``seconds`` (and with the latest holder and PIDs, after the job's start-up, if
    ``same_holder``), recomputed from scratch: what the analyzer's running windows must hold."""
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
        if same_holder and iv.startup is not None and last.startup is None:
            break  # the job's start-up is left out of its steady windows
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
        sm=_mean((_m(iv, "sm"), iv.seconds) for iv in ivs),
        tensor=_mean((_m(iv, "tensor"), iv.seconds) for iv in ivs),
        pcie_rx=_mean((_m(iv, "pcie_rx"), iv.seconds) for iv in ivs),
        pcie_tx=_mean((_m(iv, "pcie_tx"), iv.seconds) for iv in ivs),
        nvlink_rx=_mean((_m(iv, "nvlink_rx"), iv.seconds) for iv in ivs),
        job_cpu_cores=_mean((_m(iv, "job_cpu_cores"), iv.seconds) for iv in ivs),
        max_process_cpu_cores=_mean((_m(iv, "max_process_cpu_cores"), iv.seconds) for iv in ivs),
        dram=_mean((_m(iv, "dram"), iv.seconds) for iv in ivs),
        fp32=_mean((_m(iv, "fp32"), iv.seconds) for iv in ivs),
        io_read_bytes_per_second=_mean((_m(iv, "io_read_bytes_per_second"), iv.seconds) for iv in ivs),
        io_other_read_bytes_per_second=_mean((_m(iv, "io_other_read_bytes_per_second"), iv.seconds) for iv in ivs),
        io_write_bytes_per_second=_mean((_m(iv, "io_write_bytes_per_second"), iv.seconds) for iv in ivs),
        voluntary_switches_per_second=_mean((_m(iv, "voluntary_switches_per_second"), iv.seconds) for iv in ivs),
        whole_idle_ratio=_mean((_m(iv, "whole_idle_ratio"), iv.seconds) for iv in ivs),
        io_blocked_processes=_mean((_m(iv, "io_blocked_processes"), iv.seconds) for iv in ivs),
        stopped_processes=_mean((_m(iv, "stopped_processes"), iv.seconds) for iv in ivs),
        listening_processes=_mean((_m(iv, "listening_processes"), iv.seconds) for iv in ivs),
        host_cpu_busy_ratio=_mean((_m(iv, "host_cpu_busy_ratio"), iv.seconds) for iv in ivs),
        memory_used_bytes=last.mem_used if last else None,
        memory_total_bytes=last.mem_total if last else None,
        sm_clock_ratio=_mean((iv.clock_ratio, iv.seconds) for iv in throttled),
        throttle_fraction=sum(iv.seconds for iv in throttled) / total if total > 0 else 0.0,
        severe_throttle_fraction=sum(iv.seconds for iv in ivs if iv.severe) / total if total > 0 else 0.0,
        throttle_reasons=tuple(sorted(frozenset().union(*(iv.reasons for iv in throttled)))) if throttled else (),
        power_watts=_mean((_m(iv, "power_watts"), iv.seconds) for iv in ivs),
        power_limit_watts=last.power_limit if last else None,
        job=job.job if job and last and last.holder == "job" else None,
        job_kind=job.kind if job and last and last.holder == "job" else None,
        processes=tuple(sorted(last.pids)) if last else (),
        health=last.health if last else Health(),
        starting_seconds=last.startup if last else None,
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
            moved = p.shifted(t - base)
            gpus = [g.model_copy(update={"uuid": node.gpus[0].uuid}) for g in moved.gpus]
            out.append(moved.model_copy(update={"gpus": gpus}))
        t = out[-1].timestamp + 1.0
    return node, out


def _close(x: float, y: float) -> bool:
    """Equal to float rounding; NaN equals NaN, and a zero is exactly zero."""
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    if x == 0.0 or y == 0.0:
        return x == y
    return math.isclose(x, y, rel_tol=1e-9)


def _same(a: GpuWindow, b: GpuWindow) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, float) and isinstance(y, float):
            assert _close(x, y), (f.name, x, y)
        elif isinstance(x, dict):
            assert x.keys() == y.keys(), f.name
            for k in x:
                assert _close(x[k], y[k]), (f.name, k, x[k], y[k])
        else:
            assert x == y, (f.name, x, y)


def _check(node: object, polls: list[PollResult], window: float, diagnosis: float) -> int:
    """Run ``polls`` through an analyzer; at every poll, each running window of each GPU must hold the intervals
    ``span_of`` finds in the GPU's whole history and give the GpuWindow ``window_of`` computes from them."""
    a = InsightAnalyzer(window_seconds=window, diagnosis_seconds=diagnosis)
    history: dict[str, list[_Interval]] = {}
    checked = 0
    for poll in polls:
        a(poll, node)  # type: ignore[arg-type]
        for uuid, state in a._gpus.items():
            ivs = history.setdefault(uuid, [])
            newest = state.node.intervals[-1] if state.node.held else None
            if newest is not None and (not ivs or ivs[-1] != newest):
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
            assert len(state.node.intervals) <= window + 2  # bounded by the window (1 s polls), whatever the history
    return checked


WINDOWS = [(12.0, 5.0), (20.0, 7.0)]


@pytest.mark.parametrize(("window", "diagnosis"), WINDOWS)
def test_running_windows_equal_the_reference_on_the_ddp_recording(window: float, diagnosis: float) -> None:
    header, polls = read_trace(trace("h200x2-ddp_straggler"))
    assert _check(header.node, polls, window, diagnosis) > 100


@pytest.mark.parametrize(("window", "diagnosis"), WINDOWS)
def test_running_windows_equal_the_reference_across_job_changes(window: float, diagnosis: float) -> None:
    # compute_bound is throttled (a clock event reason), the others are not: its reasons leave the windows
    names = [f"h100-{s}" for s in ("compute_bound", "held_idle", "idle", "starved_dataloader", "compute_bound")]
    node, polls = _polls(names)
    assert _check(node, polls, window, diagnosis) > 400


def _with_sm(polls: list[PollResult], values: dict[int, float | None]) -> list[PollResult]:
    """``polls`` with GPM SM activity of every GPU set to ``values[i]`` at poll ``i`` (None: left out)."""
    out = []
    for i, p in enumerate(polls):
        if i in values:
            gpus = []
            for g in p.gpus:
                gpm = {k: v for k, v in g.gpm.items() if k != "sm_activity"}
                if values[i] is not None:
                    gpm["sm_activity"] = values[i]
                gpus.append(g.model_copy(update={"gpm": gpm}))
            p = p.model_copy(update={"gpus": gpus})
        out.append(p)
    return out


def test_a_nan_or_infinite_reading_is_unknown_and_does_not_stay_in_the_windows() -> None:
    """SM activity NaN at poll 5 and infinite at poll 12 give, at every poll, the results of the same recording
    with SM activity missing at those polls: no NaN while they are in the window, none after they left it."""
    header, polls = read_trace(trace("h200x2-ddp_straggler"))
    bad = _with_sm(polls, {5: float("nan"), 12: float("inf")})
    missing = _with_sm(polls, {5: None, 12: None})
    a, b = InsightAnalyzer(window_seconds=6.0, diagnosis_seconds=3.0), InsightAnalyzer(6.0, 3.0)
    activities = 0
    for p, q in zip(bad, missing, strict=True):
        got, want = a(p, header.node), b(q, header.node)
        assert got == want
        for g in got.gpus:
            activities += g.activity_ratio is not None
            assert g.activity_ratio is None or math.isfinite(g.activity_ratio)
        assert got.node_imbalance_ratio is None or math.isfinite(got.node_imbalance_ratio)
    assert activities > 40
    assert _check(header.node, bad, 6.0, 3.0) > 100


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


# -- long synthetic streams ----------------------------------------------------------------------------------

REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown")


def _m(iv: _Interval, name: str) -> float | None:
    """The mean ``name`` of ``iv`` (its slot in ``Interval.means``, gpuwarden.insight.diagnosis.MEANS)."""
    return iv.means[[m.name for m in MEANS].index(name)]


def _stream(n: int, seed: int, dt: float = 0.1) -> list[_Interval]:
    """``n`` random intervals about ``dt`` apart: bursts of large values (PCIe bytes/s ~1e10, NVLink ~1e11) between
    runs of zeros and unknowns, throttling with varying reasons, holder and PID changes, and gaps longer than a
    2 s window."""
    rng = random.Random(seed)
    out: list[_Interval] = []
    t = 1.7e9
    holder, pids = "job", frozenset({100})
    for k in range(n):
        w = dt * rng.uniform(0.5, 1.5)
        if rng.random() < 0.002:
            t += 5.0  # a gap: the GPU was not accounted for a while
        t += w
        if rng.random() < 0.01:
            holder, pids = rng.choice(
                [("job", frozenset({100})), ("job", frozenset({100, 101})), ("none", frozenset())]
            )
        phase = (k // 150) % 3  # 0: busy with large values, 1: all zeros, 2: unknown
        states = dict.fromkeys(st.STATES, 0.0)
        states[rng.choice(st.STATES) if phase == 0 else "free"] = w

        def val(scale: float, phase: int = phase) -> float | None:
            if phase == 1:
                return 0.0
            if phase == 2:
                return None
            return rng.uniform(0.0, scale)

        throttle = phase == 0 and rng.random() < 0.3
        out.append(
            _Interval(
                end=t,
                seconds=w,
                states=states,
                util_seconds=w if phase != 2 else 0.0,
                holder=holder,
                pids=pids,
                means=pack_means(
                    sm=val(1.0),
                    tensor=val(1.0),
                    pcie_rx=val(3e10),
                    pcie_tx=val(3e10),
                    nvlink_rx=val(4e11),
                    job_cpu_cores=val(8.0),
                    max_process_cpu_cores=val(1.0),
                    dram=val(1.0),
                    fp32=val(1.0),
                    io_read_bytes_per_second=val(1e9),
                    io_other_read_bytes_per_second=val(2e8),
                    io_write_bytes_per_second=val(5e8),
                    voluntary_switches_per_second=val(400.0),
                    whole_idle_ratio=val(1.0),
                    io_blocked_processes=val(3.0),
                    stopped_processes=val(1.0),
                    listening_processes=val(1.0),
                    host_cpu_busy_ratio=val(1.0),
                    power_watts=val(700.0),
                ),
                clock_ratio=val(1.0),
                throttle=throttle,
                severe=throttle and rng.random() < 0.3,
                reasons=frozenset(rng.sample(REASONS, rng.randint(1, 2))) if throttle else frozenset(),
                power_limit=700.0,
                mem_used=k,
                mem_total=80 << 30,
                health=Health(),
            )
        )
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_running_windows_equal_the_reference_over_a_long_synthetic_stream(seed: int) -> None:
    """Every push of 1500 intervals (0.1 s apart, 2 s and 0.7 s windows: each interval enters and leaves):
    the running windows hold what ``span_of`` finds and give what ``window_of`` computes; a window that held
    bursts of 1e10 and now holds zeros reads exactly 0."""
    ivs = _stream(1500, seed)
    runs = [
        (an.Running(2.0, False), 2.0, False),
        (an.Running(2.0, True), 2.0, True),
        (an.Running(0.7, True), 0.7, True),
    ]
    zero_windows = 0
    for i, iv in enumerate(ivs):
        packed = an.pack(iv)
        terms = an.terms(packed)
        for running, seconds, same in runs:
            running.push(packed, terms)
            span = span_of(ivs[max(0, i - 200) : i + 1], seconds, same)
            assert list(running.intervals) == span
            got = running.window(0, "u", None)
            _same(got, window_of(0, "u", span, None))
            zero_windows += got.pcie_rx == 0.0
            assert len(running.intervals) <= seconds / 0.05 + 2  # bounded by the window
    assert zero_windows > 300  # windows of zeros after bursts were met (and read exactly 0, as the reference)


def test_the_sums_are_exact_after_any_number_of_removals() -> None:
    """After 20000 intervals through a 3 s window, the running sums are, bit for bit, the sums of what the window
    holds: no drift to bound, no rebuild."""
    ivs = _stream(20000, 3)
    running = an.Running(3.0, False)
    for iv in ivs:
        running.push(an.pack(iv), an.terms(an.pack(iv)))
    fresh = an._Agg()
    for p in running.held:
        fresh.add(p, an.terms(p))
    assert running.agg.sums == fresh.sums
    assert +running.agg.reasons == +fresh.reasons
    assert len(running.intervals) <= 3.0 / 0.05 + 2


def test_a_push_computes_the_terms_of_the_intervals_that_leave_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The work of a push is bounded: it sums the interval that enters and subtracts those that leave, never
    re-reading the window (the terms of the entering interval are computed once, by the caller, for its three
    windows)."""
    calls = 0
    terms = an.terms

    def counting(p: an.Packed) -> list[tuple[int, int]] | None:
        nonlocal calls
        calls += 1
        return terms(p)

    ivs = [iv for iv in _stream(3000, 4) if iv.holder == "job"]
    ivs = [dataclasses.replace(iv, pids=frozenset({1}), end=1e9 + 0.1 * k, seconds=0.1) for k, iv in enumerate(ivs)]
    running = an.Running(30.0, False)
    for iv in ivs:
        running.push(an.pack(iv), terms(an.pack(iv)))
    monkeypatch.setattr(an, "terms", counting)
    for k in range(1000):
        p = an.pack(dataclasses.replace(ivs[k], end=ivs[-1].end + 0.1 * (k + 1)))
        running.push(p, terms(p))
    # one interval left per push: 1,000 in all, but for the one a float boundary (1e9 + 0.1 k) keeps a push longer
    assert 999 <= calls <= 1000


def test_polls_faster_than_a_second_are_windowed_at_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """At a 0.1 s poll the windows hold about one interval a second (memory bounded at any poll interval), with the
    same state seconds, starved ratio and verdict as windows of every 0.1 s interval."""
    header, polls = read_trace(trace("h100-starved_dataloader"))
    t0 = polls[0].timestamp

    def fast(p):  # noqa: ANN001, ANN202 - the recording's polls, 0.1 s apart (ten times faster)
        shift = (p.timestamp - t0) * 0.9
        gpus = [g.model_copy(update={"timestamp": g.timestamp - shift, "utilization_samples": []}) for g in p.gpus]
        return p.model_copy(update={"timestamp": p.timestamp - shift, "gpus": gpus})

    fast_polls = [fast(p) for p in polls]

    def run(granularity: float):  # noqa: ANN202
        monkeypatch.setattr(an, "GRANULARITY_SECONDS", granularity)
        a = InsightAnalyzer(window_seconds=300.0)
        for p in fast_polls:
            result = a(p, header.node)
        return a, result

    coarse, got = run(1.0)
    fine, want = run(0.0)
    state, ref = next(iter(coarse._gpus.values())), next(iter(fine._gpus.values()))
    seconds = fast_polls[-1].timestamp - fast_polls[1].timestamp
    assert len(state.node.intervals) <= seconds / 1.0 + 2 < len(ref.node.intervals)
    assert got.gpus[0].state_seconds_total == pytest.approx(want.gpus[0].state_seconds_total, abs=1e-9)
    assert got.gpus[0].starved_ratio == pytest.approx(want.gpus[0].starved_ratio, abs=1e-9)
    assert got.gpus[0].diagnosis is not None and want.gpus[0].diagnosis is not None
    assert got.gpus[0].diagnosis.verdict == want.gpus[0].diagnosis.verdict


def test_a_window_holds_intervals_the_garbage_collector_no_longer_walks() -> None:
    """The windows hold each interval as one tuple of numbers, strings and tuples (windows.pack), which ``unpack``
    turns back into an equal Interval; after collections the collector tracks none of them, so a full window adds
    nothing to what every full collection walks. The three windows of a GPU share each interval's tuple."""
    import gc

    for iv in _stream(300, 5):
        assert an.unpack(an.pack(iv)) == iv
    header, polls = read_trace(trace("h200x2-ddp_straggler"))
    a = InsightAnalyzer(window_seconds=20.0, diagnosis_seconds=7.0)
    for poll in polls:
        a(poll, header.node)  # type: ignore[arg-type]
    for _ in range(2):  # CPython untracks a tuple once its items are untracked: a collection may meet it first
        gc.collect()
    held = [p for state in a._gpus.values() for p in state.node.held]
    assert len(held) >= 2 * 15
    assert not [p for p in held if gc.is_tracked(p)]
    for state in a._gpus.values():
        assert state.diag.held[-1] is state.node.held[-1]

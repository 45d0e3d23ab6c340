"""Periodic GPU work read at the poll's own period: util.gpu and busy time hold to the work's duty cycle.

NVML samples util.gpu about every sixth of a second (each sample: the share of its period in which a kernel ran) and
nvmlDeviceGetUtilizationRates answers the last sample alone. An inference server answering one request a second
(80 ms of kernels each) polled every second reads the same phase of its period on every poll: 0% (or 100%) for ever.
Here a model of that sampling (``PeriodicGpu``) answers the two calls on a virtual clock while the rest of the GPU is
the fake NVML's recorded H100; the daemon's poller, analyzer and exposition run as they do live, and the busy time
they account is held to the duty cycle at periods that divide the poll period, equal it and exceed it.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from conftest import render, trace
from fake_nvml import FakeNvml
from test_faults import value

from gpuwarden.config import Config
from gpuwarden.daemon import build_analyzers
from gpuwarden.nvml import NvmlSource
from gpuwarden.poller import Poller

#: NVML's util.gpu sample period on Hopper (about six samples a second: gpuwarden.insight.vocabulary.states).
SAMPLE_SECONDS = 1 / 6


class PeriodicGpu:
    """util.gpu of work that runs ``busy`` seconds at the start of every ``period`` seconds, as NVML samples it: one
    sample at every multiple of ``sample`` seconds, each the share of the sample's period the work ran."""

    def __init__(self, period: float, busy: float, sample: float = SAMPLE_SECONDS, phase: float = 0.0) -> None:
        self.period, self.busy, self.sample, self.phase = period, busy, sample, phase

    def ran(self, a: float, b: float) -> float:
        """Seconds of (a, b] in which the work ran."""
        total, k = 0.0, int((a - self.phase) // self.period) - 1
        while self.phase + k * self.period < b:
            start = self.phase + k * self.period
            total += max(0.0, min(b, start + self.busy) - max(a, start))
            k += 1
        return total

    def value(self, t: float) -> float:
        """The sample at ``t``: the share of (t - sample, t] the work ran."""
        return self.ran(t - self.sample, t) / self.sample

    def stamps(self, after: float, until: float) -> list[float]:
        """The sample times in (after, until]."""
        k = int(after // self.sample) + 1
        out = []
        while k * self.sample <= until:
            out.append(k * self.sample)
            k += 1
        return out


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A virtual wall clock (time.time) the test moves; it starts on a whole second, as a poll loop's phase may."""
    now = [1_800_000_000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    return now


def periodic_nvml(monkeypatch: pytest.MonkeyPatch, clock: list[float], work: PeriodicGpu) -> FakeNvml:
    """The fake NVML of a recorded H100 whose util.gpu (the sample buffer and the instantaneous reading) is ``work``'s
    on ``clock``."""
    fake = FakeNvml(trace("h100-held_idle")).install(monkeypatch)

    def utilization(handle: Any) -> Any:
        last = work.stamps(clock[0] - work.sample, clock[0])
        return SimpleNamespace(gpu=round(work.value(last[-1]) * 100), memory=0)

    def samples(handle: Any, sampling_type: int, last_seen_us: int) -> tuple[int, list[Any]]:
        assert sampling_type == pynvml.NVML_GPU_UTILIZATION_SAMPLES
        out = []
        for t in work.stamps(max(last_seen_us / 1e6, clock[0] - 20.0), clock[0]):  # the buffer holds ~20 s
            s = pynvml.c_nvmlSample_t()
            s.timeStamp = round(t * 1e6)
            s.sampleValue.uiVal = round(work.value(t) * 100)
            if s.timeStamp > last_seen_us:
                out.append(s)
        if not out:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, out

    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", utilization)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetSamples", samples)
    return fake


def run(clock: list[float], polls: int, interval: float = 1.0) -> tuple[list[float], str]:
    """Poll ``polls`` times ``interval`` s apart on ``clock`` through the daemon's own poller and analyzer: (each
    poll's util.gpu of GPU 0, the exposition after the last)."""
    source = NvmlSource(gpm_interval=0.0, processes=False, xid_events=False)
    p = Poller(source, interval, analyzers=build_analyzers(Config()))
    p.start(thread=False)
    utils = []
    for _ in range(polls):
        clock[0] += interval
        p.poll_once()
        assert p.snapshot is not None
        utils.append(p.snapshot.poll.gpus[0].utilization_gpu_ratio)
    text = render(p.snapshot)
    p.stop()
    return utils, text


def busy_and_accounted(text: str, uuid: str) -> tuple[float, float]:
    """(busy seconds, every state's seconds) of GPU 0 in gpu_state_seconds_total."""
    states = ("busy", "starved", "paused", "held_idle", "allocated_idle", "free", "unknown", "lost")
    per = {s: value(text, "gpu_state_seconds_total", gpu="0", uuid=uuid, state=s) or 0.0 for s in states}
    return per["busy"], sum(per.values())


@pytest.mark.parametrize(
    ("period", "busy"),
    [
        (1.0, 0.08),  # one request a second of 80 ms: the poll sees the same phase every time
        (0.5, 0.08),  # two a second
        (0.25, 0.04),  # four a second
        (2.0, 0.3),  # one every two polls
        (1.0, 0.9),  # mostly busy, idle in the same phase each second: read as 100% by the last sample
        (5.0, 0.5),  # one every five seconds
    ],
)
def test_periodic_work_reads_its_duty_cycle_at_the_default_poll(
    monkeypatch: pytest.MonkeyPatch, clock: list[float], period: float, busy: float
) -> None:
    work = PeriodicGpu(period, busy)
    fake = periodic_nvml(monkeypatch, clock, work)
    # the poll lands in the work's idle phase: the instantaneous reading (the last sample) says 0 on every poll
    # of a period dividing the poll period, and 100% where the idle phase is shorter than a sample
    instantaneous = [work.value(work.stamps(t - work.sample, t)[-1]) for t in (clock[0] + k for k in range(1, 21))]
    polls = 20
    utils, text = run(clock, polls)
    duty = busy / period
    ran = work.ran(clock[0] - polls, clock[0]) / polls
    assert ran == pytest.approx(duty, abs=0.02)
    if period <= 1.0:
        assert len(set(instantaneous)) == 1 and abs(instantaneous[0] - duty) > 0.05, instantaneous  # it aliases
    # each poll's util.gpu is the mean of its interval's samples: the duty cycle, poll by poll where the period
    # divides the poll's, on average otherwise
    truth = work.ran(clock[0] - (polls - 1), clock[0]) / (polls - 1)  # the intervals of polls 2 to 20
    assert sum(u for u in utils[1:] if u is not None) / (polls - 1) == pytest.approx(truth, abs=0.02)
    if period <= 1.0:
        assert all(u == pytest.approx(duty, abs=0.02) for u in utils[1:]), utils
    # the exposition says the same, and the accounting's busy seconds hold to the work's own clock
    assert value(text, "gpu_utilization_ratio", gpu="0", uuid=fake.devices[0].static.uuid) == pytest.approx(utils[-1])
    busy_s, accounted = busy_and_accounted(text, fake.devices[0].static.uuid)
    assert accounted > 0
    assert busy_s / accounted == pytest.approx(work.ran(clock[0] - accounted, clock[0]) / accounted, abs=0.03)


def test_a_poll_without_a_new_sample_keeps_the_instantaneous_reading(
    monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    """Polls faster than NVML samples (0.05 s) find no new sample in most intervals (NOT_FOUND): util.gpu is then the
    last sample (nvmlDeviceGetUtilizationRates), never a missing or zero reading."""
    work = PeriodicGpu(1.0, 0.5)
    periodic_nvml(monkeypatch, clock, work)
    utils, _ = run(clock, 60, interval=0.05)
    assert None not in utils
    # each poll holds the sample of its own sixth of a second: over three periods, their mean is the duty cycle
    assert sum(u for u in utils if u is not None) / len(utils) == pytest.approx(0.5, abs=0.1)

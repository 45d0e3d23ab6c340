"""The launch-limited test (gpuwarden.insight.launches) and the ``launch`` cause of idle time it drives."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TRACES

from gpuwarden.insight.analyzer import InsightAnalyzer, insight_result
from gpuwarden.insight.launches import launch_limited
from gpuwarden.insight.vocabulary.states import Segment, gaps_in_periods, idle_causes
from gpuwarden.trace import read_trace

# util, sm, busiest process cores, job cores, whole-idle share, io_busy, copies
TINY = (0.36, 0.008, 1.0, 1.0, 0.0, False, False)  # as h100-k-mid-kernels-size-22528
MID = (0.46, 0.20, 1.0, 1.0, 0.0, False, False)  # as h100-k-mid-gemms-size-11


def test_tiny_and_mid_size_kernels_from_one_busy_thread_are_launch_limited() -> None:
    assert launch_limited(*TINY) and launch_limited(*MID)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({0: 0.05}, "kernels run too seldom to be a stream"),
        ({2: 0.3}, "no thread keeps a core busy"),
        ({1: None}, "SM activity unknown (no GPM)"),
        ({6: True}, "copies over PCIe: the gaps are host work or copies"),
    ],
)
def test_not_launch_limited(change: dict[int, object], why: str) -> None:
    for base in (TINY, MID):
        args: list[object] = list(base)
        for i, v in change.items():
            args[i] = v
        assert not launch_limited(*args), why  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({5: True}, "reads storage or sockets: the gaps may be input"),
        ({4: 0.4}, "the idle time is in whole sample periods: a wait between steps"),
        ({3: 3.0}, "helper processes work: DataLoader workers feeding it"),
        ({0: 0.8}, "idle under a quarter of the time"),
        ({1: 0.3}, "kernels cover most SMs"),
    ],
)
def test_mid_size_kernels_need_launch_gaps_and_no_other_work(change: dict[int, object], why: str) -> None:
    args: list[object] = list(MID)
    for i, v in change.items():
        args[i] = v
    assert not launch_limited(*args), why  # type: ignore[arg-type]
    tiny: list[object] = list(TINY)
    for i, v in change.items():
        if i in (3, 4, 5):  # tiny kernels: the job's other work does not change what its kernels look like
            tiny[i] = v
    assert launch_limited(*tiny)  # type: ignore[arg-type]


def test_launch_gaps_take_the_idle_time_inside_periods_that_ran_kernels() -> None:
    segs = [Segment(1.0, 0.5, 0.4), Segment(1.5, 0.5, 0.0), Segment(2.0, 1.0, 0.2)]
    gaps = gaps_in_periods(segs)
    assert gaps == pytest.approx(0.6 * 0.5 + 0.8 * 1.0)
    states = {"busy": 0.4, "starved": 1.6}
    out = idle_causes(states, 1.0, io_waiting=False, launch_gaps=gaps)
    assert out["launch"] == pytest.approx(1.1) and out["input_cpu"] == pytest.approx(0.5)
    # reads, writes or an unknown CPU keep their causes: launch gaps only split what would be input_cpu
    assert "launch" not in idle_causes(states, 1.0, io_waiting=True, launch_gaps=gaps)
    assert "launch" not in idle_causes(states, None, io_waiting=False, launch_gaps=gaps)
    assert "launch" not in idle_causes(states, 1.0, io_waiting=True, writing=True, launch_gaps=gaps)


def _causes(path: Path) -> dict[str, float]:
    header, polls = read_trace(path)
    analyzer = InsightAnalyzer()
    result = None
    for poll in polls:
        result = analyzer(poll, header.node)
    assert result is not None
    g = insight_result(result).gpus[0]
    total = sum(g.idle_seconds_total.values()) + g.state_seconds_total["busy"]
    return {k: v / total for k, v in g.idle_seconds_total.items()}


@pytest.mark.parametrize(
    "name",
    ["h100-k-launch-bound", "h100-k-mid-kernels-size-22528", "h100-k-mid-gemms-size-11", "h100-k-mid-sorts-size-44"],
)
def test_launch_bound_recordings_lose_their_time_to_launches(name: str) -> None:
    causes = _causes(TRACES / f"{name}.jsonl.gz")
    assert causes["launch"] > 0.4 and causes["launch"] > 5 * causes["input_cpu"], causes


@pytest.mark.parametrize(
    "name",
    [
        "h100-k-host-optimizer-size-4096",  # tiny kernels, but GB/s over PCIe both ways: host work
        "h100-k-loader-workers-workers-0",  # the training process makes its input
        "h100-k-loader-workers-workers-4-size-8192-b",
        "h100-starved_cpu_heavy",
        "h100-k-bf16-matmul-b",
    ],
)
def test_input_and_host_work_lose_no_time_to_launches(name: str) -> None:
    causes = _causes(TRACES / f"{name}.jsonl.gz")
    assert causes["launch"] < 0.01, causes

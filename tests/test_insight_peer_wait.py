"""Time and energy a GPU spends waiting in a collective on a peer of its job (busy by NVML's definition)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from conftest import TRACES

from gpuwarden.insight.analyzer import InsightAnalyzer, insight_result
from gpuwarden.insight.peers import peer_wait_share
from gpuwarden.insight.vocabulary.result import GpuInsight
from gpuwarden.trace import read_trace


@dataclass(frozen=True)
class G:
    index: int
    util: float | None
    sm: float | None


def test_a_cpu_side_straggler_leaves_its_peer_spinning_for_the_kernel_time_it_lacks() -> None:
    # as the 2 x H200 DDP recording: rank 0 in kernels all the time, SMs 26% active; rank 1 in kernels 15%, SMs 9.5%
    waiter, straggler = (
        G(
            0,
            1.0,
            0.26,
        ),
        G(1, 0.15, 0.095),
    )
    assert peer_wait_share(waiter, [straggler]) == pytest.approx(0.85)
    assert peer_wait_share(straggler, [waiter]) == 0.0


def test_a_gpu_side_straggler_leaves_its_peer_with_fewer_sms_active() -> None:
    # both in kernels all the time; the straggler's work fills 90% of the SMs, the waiter's 37% (its work then waits)
    waiter, straggler = G(0, 1.0, 0.37), G(1, 1.0, 0.9)
    assert peer_wait_share(waiter, [straggler]) == pytest.approx(1 - 0.37 / 0.9)
    assert peer_wait_share(straggler, [waiter]) == 0.0


@pytest.mark.parametrize(
    ("gpu", "peers", "why"),
    [
        (G(0, 1.0, 0.9), [G(1, 1.0, 0.9)], "balanced ranks"),
        (G(0, 1.0, None), [G(1, 0.15, 0.1)], "no SM activity (no GPM): cannot tell spinning from work"),
        (G(0, 0.3, 0.05), [G(1, 0.1, 0.05)], "not utilized"),
        (G(0, 1.0, 0.26), [], "no peer"),
    ],
)
def test_no_wait_without_the_evidence(gpu: G, peers: list[G], why: str) -> None:
    assert peer_wait_share(gpu, peers) == 0.0, why


def _gpus(name: str) -> list[GpuInsight]:
    header, polls = read_trace(TRACES / f"{name}.jsonl.gz")
    analyzer = InsightAnalyzer()
    result = None
    for poll in polls:
        result = analyzer(poll, header.node)
    assert result is not None
    return insight_result(result).gpus


def test_the_ddp_recording_counts_the_waiting_rank_s_spin_and_its_energy() -> None:
    waiter, straggler = _gpus("h200x2-ddp_straggler")
    busy = waiter.state_seconds_total["busy"]
    # rank 0's kernel time beyond rank 1's is its wait; rank 1 waits on nobody
    assert waiter.peer_wait_seconds_total == pytest.approx(busy - straggler.state_seconds_total["busy"], rel=0.05)
    assert 0.5 * busy < waiter.peer_wait_seconds_total < busy
    assert straggler.peer_wait_seconds_total == 0.0 and straggler.peer_wait_energy_joules_total == 0.0
    # spinning draws power above the floor: as much as the straggler's idle GPU while it works on the CPU
    assert waiter.peer_wait_energy_joules_total is not None and straggler.idle_energy_joules_total is not None
    assert waiter.peer_wait_energy_joules_total > 0.5 * sum(straggler.idle_energy_joules_total.values())


def test_a_straggler_that_moves_between_gpus_makes_each_wait_in_turn() -> None:
    gpus = _gpus("derived-h200x2-moving")
    assert all(g.peer_wait_seconds_total > 5 for g in gpus), [g.peer_wait_seconds_total for g in gpus]


def test_a_peer_that_went_down_leaves_no_wait_behind() -> None:
    """GPU 1 of the DDP recording falls off the bus half-way: from then on GPU 0 waits on nobody of this node (its
    last interval before the fall stays counted), whatever GPU 1's last interval said."""
    header, polls = read_trace(TRACES / "h200x2-ddp_straggler.jsonl.gz")
    half = len(polls) // 2
    analyzer = InsightAnalyzer()
    totals = []
    for i, poll in enumerate(polls):
        if i >= half:
            down = poll.gpus[1].model_copy(update={"up": False, "error": "gpu_is_lost"})
            poll = poll.model_copy(update={"gpus": [poll.gpus[0], down]})
        totals.append(insight_result(analyzer(poll, header.node)).gpus[0].peer_wait_seconds_total)
    assert totals[half - 1] > 5  # it waited while its peer was up
    assert totals[-1] == totals[half - 1]

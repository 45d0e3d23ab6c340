"""The FLOP utilization estimate (OFU, gpuwarden.insight.ofu) on real H100 recordings and on missing inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.insight.ofu import flop_utilization
from gpuwarden.trace import read_trace

TRACES = Path(__file__).parent / "data" / "traces"


def _series(name: str) -> list[float]:
    header, polls = read_trace(TRACES / f"{name}.jsonl.gz")
    static = header.node.gpus[0]
    return [v for p in polls for v in [flop_utilization(p.gpus[0], static)] if v is not None]


def test_bf16_products_read_near_their_mfu_and_fp32_without_tf32_reads_zero() -> None:
    """Recorded on an H100 (tests/data/README.md): bf16 products ran at 0.61-0.63 MFU in tools/ofu_check.py's runs
    on the same GPU; FP32 products with TF32 off use no tensor pipe at all, whatever their FLOPs."""
    bf16, fp32 = _series("h100-k-bf16-matmul"), _series("h100-k-fp32-matmul")
    assert len(bf16) >= 10 and len(fp32) >= 10
    busy = sorted(bf16)[len(bf16) // 2]
    assert 0.5 < busy < 0.75
    assert max(fp32) < 0.01


def test_the_estimate_is_tensor_activity_times_the_clock_share() -> None:
    header, polls = read_trace(TRACES / "h100-k-bf16-matmul.jsonl.gz")
    static = header.node.gpus[0]
    g = next(p.gpus[0] for p in polls if p.gpus[0].gpm.get("tensor_activity"))
    half = g.model_copy(update={"clock_hertz": {**g.clock_hertz, "sm": static.clock_max_hertz["sm"] / 2}})
    assert flop_utilization(half, static) == pytest.approx(g.gpm["tensor_activity"] / 2)


@pytest.mark.parametrize("missing", ["gpm", "clock", "max_clock", "down", "static"])
def test_missing_inputs_give_none_not_zero(missing: str) -> None:
    header, polls = read_trace(TRACES / "h100-k-bf16-matmul.jsonl.gz")
    static = header.node.gpus[0]
    g = next(p.gpus[0] for p in polls if p.gpus[0].gpm.get("tensor_activity"))
    if missing == "gpm":
        g = g.model_copy(update={"gpm": {}})
    elif missing == "clock":
        g = g.model_copy(update={"clock_hertz": {}})
    elif missing == "max_clock":
        static = static.model_copy(update={"clock_max_hertz": {"sm": 0.0}})
    elif missing == "down":
        g = g.model_copy(update={"up": False})
    assert flop_utilization(g, None if missing == "static" else static) is None

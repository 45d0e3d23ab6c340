#!/usr/bin/env python3
"""Checks gpuwarden's FLOP utilization estimate (OFU) against the MFU that workloads compute from their own FLOPs.

    python3 tools/ofu_check.py [--seconds S] [--gpu N] [--json OUT] [--only NAME ...]

Runs, one after the other on one GPU, matrix products in bf16 and TF32 at several sizes, a bf16 product that pauses
half the time, a bf16 transformer layer's training step, and FP8 products (Hopper). Each counts its own floating-
point operations (model FLOPs: 2*m*n*k per product; a training step is three times its forward pass, flash-attention
recompute not counted) over its timed window, and its MFU is those FLOPs per second over the GPU's dense tensor peak
for the precision at the GPU's maximum SM clock (SMs x dense FLOPs per SM per clock x max SM clock, the clock from
NVML). Meanwhile gpuwarden's own NVML layer polls the GPU every second; the estimate per poll is
``gpuwarden.insight.ofu.flop_utilization`` (GPM any-tensor activity x SM clock / max SM clock), averaged over the
workload's window. Prints one JSON line per workload and a table. Needs PyTorch, an NVIDIA GPU of compute capability
8.0 or 9.0 (the dense-rate table below), and GPM (Hopper) for the estimate.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: Dense tensor-core FLOPs per SM per clock, by compute capability and precision (NVIDIA's A100 and H100 white
#: papers: A100 bf16 312 TFLOP/s = 108 SMs x 2048 x 1.41 GHz; H100 SXM bf16 989.4 TFLOP/s = 132 x 4096 x 1.83 GHz;
#: TF32 half of bf16 on both).
#: FP8 (Hopper) twice bf16: H100 SXM 1,978.9 TFLOP/s dense = 132 x 8192 x 1.83 GHz.
DENSE_PER_SM_CLOCK = {(8, 0): {"bf16": 2048, "tf32": 1024}, (9, 0): {"bf16": 4096, "tf32": 2048, "fp8": 8192}}


def _products(size: int, dtype: str, duty: float = 1.0) -> Callable[[object, float], float]:
    """Back-to-back ``size``-square matrix products; with ``duty`` < 1 the loop sleeps (1 - duty) of every second.
    Returns the FLOPs done until ``end``."""

    def run(torch: object, end: float) -> float:
        t: Any = torch
        t.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        a = t.randn(size, size, device="cuda", dtype=t.bfloat16 if dtype == "bf16" else t.float32)
        flops, per = 0.0, 2.0 * size**3
        while time.time() < end:
            busy_until = time.time() + duty
            while time.time() < min(busy_until, end):
                for _ in range(10):
                    a @ a
                t.cuda.synchronize()
                flops += 10 * per
            if duty < 1.0 and time.time() < end:
                time.sleep(min(1.0 - duty, max(0.0, end - time.time())))
        return flops

    return run


def _fp8_products(size: int) -> Callable[[object, float], float]:
    """Back-to-back ``size``-square FP8 (e4m3) matrix products through torch._scaled_mm (per-tensor scales, bf16
    out), as FP8 training and inference run their GEMMs on Hopper. Returns the FLOPs done until ``end``."""

    def run(torch: object, end: float) -> float:
        t: Any = torch
        a = t.randn(size, size, device="cuda").to(t.float8_e4m3fn)
        b = t.randn(size, size, device="cuda").to(t.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
        one = t.ones((), device="cuda")
        flops, per = 0.0, 2.0 * size**3
        while time.time() < end:
            for _ in range(10):
                t._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=t.bfloat16)
            t.cuda.synchronize()
            flops += 10 * per
        return flops

    return run


def _transformer(d: int, heads: int, seq: int, batch: int) -> Callable[[object, float], float]:
    """A bf16 transformer layer (attention through scaled_dot_product_attention, a 4x MLP) trained step by step;
    FLOPs per step: 3 x forward, forward = 24*tokens*d^2 (projections and MLP) + 4*batch*seq^2*d (attention)."""

    def run(torch: object, end: float) -> float:
        t: Any = torch
        nn, f = t.nn, t.nn.functional
        qkv, out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        up, down = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)
        layer = nn.ModuleList([qkv, out, up, down]).cuda().to(t.bfloat16)
        opt = t.optim.SGD(layer.parameters(), lr=1e-4)
        x = t.randn(batch, seq, d, device="cuda", dtype=t.bfloat16)
        tokens = batch * seq
        per = 3 * (24 * tokens * d * d + 4 * batch * seq * seq * d)
        flops = 0.0
        while time.time() < end:
            q, k, v = qkv(x).view(batch, seq, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = f.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, seq, d)
            h = x + out(a)
            y = h + down(f.gelu(up(h)))
            y.float().pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            t.cuda.synchronize()
            flops += per
        return flops

    return run


#: name -> (precision of its MFU, the workload)
WORKLOADS: dict[str, tuple[str, Callable[[object, float], float]]] = {
    "bf16_matmul_8192": ("bf16", _products(8192, "bf16")),
    "bf16_matmul_4096": ("bf16", _products(4096, "bf16")),
    "bf16_matmul_1024": ("bf16", _products(1024, "bf16")),
    "bf16_matmul_8192_half_paused": ("bf16", _products(8192, "bf16", duty=0.5)),
    "tf32_matmul_8192": ("tf32", _products(8192, "tf32")),
    "tf32_matmul_2048": ("tf32", _products(2048, "tf32")),
    "bf16_transformer_step": ("bf16", _transformer(2048, 16, 2048, 8)),
    "fp8_matmul_8192": ("fp8", _fp8_products(8192)),
    "fp8_matmul_4096": ("fp8", _fp8_products(4096)),
}


class _Sampler(threading.Thread):
    """Polls one GPU through gpuwarden's NVML layer every ``interval`` s: (time, OFU, tensor activity, SM clock Hz)."""

    def __init__(self, gpu: int, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        from gpuwarden.nvml import NvmlSource

        self.source = NvmlSource(processes=False, xid_events=False, gpu_indices=[gpu], gpm_interval=0.0)
        self.static = self.source.open().gpus[0]
        self.interval, self.stopped = interval, threading.Event()
        self.samples: list[tuple[float, float | None, float | None, float | None]] = []

    def run(self) -> None:
        from gpuwarden.insight.ofu import flop_utilization

        while not self.stopped.wait(self.interval):
            g = self.source.poll().gpus[0]
            self.samples.append(
                (g.timestamp, flop_utilization(g, self.static), g.gpm.get("tensor_activity"), g.clock_hertz.get("sm"))
            )

    def with_mean_clock(self, clocks: _Clocks, start: float, end: float, top: float) -> float | None:
        """The mean over the polls inside [start, end] of tensor activity x the SM clock averaged over the poll's own
        interval (``clocks``' fast samples since the previous poll) / ``top``: OFU with the interval's mean clock."""
        vals, prev = [], None
        for t, _, tensor, _ in self.samples:
            if prev is not None and start <= t <= end and tensor is not None:
                inside = [c for ct, c, _ in clocks.samples if prev < ct <= t]
                if inside:
                    vals.append(tensor * (sum(inside) / len(inside)) / top)
            prev = t
        return sum(vals) / len(vals) if vals else None

    def mean(self, start: float, end: float) -> tuple[float | None, int]:
        """The mean estimate over the polls inside [start, end] and how many there were."""
        vals = [o for t, o, _, _ in self.samples if start <= t <= end and o is not None]
        return (sum(vals) / len(vals) if vals else None), len(vals)


class _Clocks(threading.Thread):
    """Reads one GPU's SM clock and clock event reasons through gpuwarden's NVML layer every ``every`` s:
    (time, SM clock Hz, reasons bitmask), to compare the clock at a poll with its mean between polls."""

    def __init__(self, gpu: int, every: float) -> None:
        super().__init__(daemon=True)
        from gpuwarden.nvml import NvmlSource

        self.source = NvmlSource(
            processes=False, xid_events=False, gpu_indices=[gpu], gpm_interval=1e9, slow_interval=1e9
        )
        self.source.open()
        self.every, self.stopped = every, threading.Event()
        self.samples: list[tuple[float, float, int]] = []

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            g = self.source.poll().gpus[0]
            clock = g.clock_hertz.get("sm")
            if clock is not None:
                self.samples.append((g.timestamp, clock, g.clock_event_reasons or 0))

    def summary(self, start: float, end: float) -> dict[str, float | None]:
        """Mean SM clock (MHz) and the share of samples with any reason but idle (bit 0) set, inside [start, end]."""
        inside = [(c, r) for t, c, r in self.samples if start <= t <= end]
        if not inside:
            return {"mean_clock_mhz": None, "reasons_share": None}
        return {
            "mean_clock_mhz": round(sum(c for c, _ in inside) / len(inside) / 1e6, 1),
            "reasons_share": round(sum(1 for _, r in inside if r & ~1) / len(inside), 3),
        }


def main() -> int:
    """Run every workload with the sampler polling; print and (--json) write the table. Exit 1 where the GPU has
    no dense-rate entry or NVML no maximum SM clock."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=14.0, help="timed seconds per workload (after 3 s of warm-up)")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the results here as a JSON list")
    ap.add_argument(
        "--clock-every",
        type=float,
        default=0.0,
        metavar="S",
        help="also read the SM clock every S s (e.g. 0.05) and give OFU with each poll interval's mean clock",
    )
    ap.add_argument("--only", nargs="+", choices=sorted(WORKLOADS), metavar="NAME", help="run only these workloads")
    a = ap.parse_args()
    import torch  # type: ignore[import-not-found]

    torch.cuda.set_device(a.gpu)
    props = torch.cuda.get_device_properties(a.gpu)
    rates = DENSE_PER_SM_CLOCK.get((props.major, props.minor))
    if rates is None:
        print(f"ofu_check: no dense-rate table for compute capability {props.major}.{props.minor}", file=sys.stderr)
        return 1
    sampler = _Sampler(a.gpu)
    max_clock = sampler.static.clock_max_hertz.get("sm")
    if not max_clock:
        print("ofu_check: NVML gave no maximum SM clock", file=sys.stderr)
        return 1
    sampler.start()
    clocks = _Clocks(a.gpu, a.clock_every) if a.clock_every > 0 else None
    if clocks is not None:
        clocks.start()
    results = []
    for name, (precision, work) in WORKLOADS.items():
        if a.only and name not in a.only:
            continue
        if precision not in rates:
            print(f"ofu_check: {name}: no dense {precision} rate for this GPU, skipped", file=sys.stderr)
            continue
        work(torch, time.time() + 3.0)  # warm-up: allocation, autotuning, clocks
        start = time.time()
        flops = work(torch, start + a.seconds)
        end = time.time()
        peak = props.multi_processor_count * rates[precision] * max_clock
        mfu = flops / (end - start) / peak
        time.sleep(1.5)  # the poll that covers the window's last second
        ofu, polls = sampler.mean(start + 1.0, end + 1.0)
        row = {"workload": name, "precision": precision, "seconds": round(end - start, 2),
               "tflops": round(flops / (end - start) / 1e12, 1), "peak_tflops": round(peak / 1e12, 1),
               "mfu": round(mfu, 4), "ofu": None if ofu is None else round(ofu, 4), "polls": polls,
               "gpu": props.name, "sms": props.multi_processor_count, "max_sm_clock_hz": max_clock}  # fmt: skip
        if clocks is not None:
            at_polls = [c for t, _, _, c in sampler.samples if start + 1.0 <= t <= end + 1.0 and c is not None]
            mean_ofu = sampler.with_mean_clock(clocks, start + 1.0, end + 1.0, max_clock)
            row |= clocks.summary(start, end) | {
                "poll_clock_mhz": round(sum(at_polls) / len(at_polls) / 1e6, 1) if at_polls else None,
                "ofu_mean_clock": None if mean_ofu is None else round(mean_ofu, 4),
            }
        results.append(row)
        print(json.dumps(row), flush=True)
        time.sleep(2.0)  # idle between workloads
    sampler.stopped.set()
    sampler.join()
    if clocks is not None:
        clocks.stopped.set()
        clocks.join()
        clocks.source.close()
    sampler.source.close()
    print(f"\n{'workload':32} {'MFU':>7} {'OFU':>7} {'diff':>7} {'OFU mean clock':>15} {'diff':>7}")
    for r in results:
        cells = []
        for key in ("ofu", "ofu_mean_clock"):
            v = r.get(key)
            cells += ["-", "-"] if v is None else [f"{v:.3f}", f"{(v - r['mfu']) * 100:+.1f}"]
        print(f"{r['workload']:32} {r['mfu']:7.3f} {cells[0]:>7} {cells[1]:>7} {cells[2]:>15} {cells[3]:>7}")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

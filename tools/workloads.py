#!/usr/bin/env python3
"""GPU workloads with a known cause of (low) utilization, for recording traces and checking the diagnosis.

    python3 tools/workloads.py list
    python3 tools/workloads.py run SCENARIO [--seconds S] [--gpu N] [--size N] [--workers N] [--busy S] [--pause S]

Each scenario stands for one kind of workload the diagnosis names; the knobs make variants of it (other sizes,
worker counts, duty cycles), so a rule is checked on more than the one recording it was written from. Needs
PyTorch and an NVIDIA GPU. Prints one JSON line at the end: scenario, knobs, seconds, steps, pid.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

SCENARIOS = {
    "launch_bound": "many tiny kernels launched one at a time from Python: the GPU waits on the launching CPU thread",
    "loader_workers": "DataLoader with many worker processes and pinned memory whose CPU work still cannot keep up",
    "self_paused": "computes for --busy seconds, then the job itself sleeps --pause seconds (eval, checkpoint, wait)",
    "d2d_copy": "device-to-device copies of large tensors: HBM bandwidth bound, no arithmetic",
    "elementwise": "large elementwise arithmetic (a*b+c in fp32): memory-bandwidth bound kernels",
    "fp32_matmul": "FP32 matrix products with TF32 off: SMs busy, tensor cores idle",
    "bf16_matmul": "bf16 matrix products: compute bound on the tensor cores (the healthy reference)",
    "pinned_h2d": "host-to-device copies from pinned memory in a loop: PCIe bound, SMs idle",
    "io_reader": "a loader that reads files from storage with the page cache dropped each pass: waits on I/O",
    "host_optimizer": "forward and backward on the GPU, the optimizer step on the CPU (as CPU-offloaded optimizers do):"
    " gradients go device-to-host, parameters come back",
    "host_metrics": "a GPU step, then its outputs copied to the host and metrics computed there in the training loop",
}


def _sync(torch: object) -> None:
    torch.cuda.synchronize()  # type: ignore[attr-defined]


def launch_bound(dev: object, end: float, size: int) -> int:
    """Tiny elementwise kernels, one launch each, no batching: each kernel runs microseconds, each launch costs
    the CPU thread several microseconds more."""
    import torch

    x = torch.ones(size, device=dev)
    steps = 0
    while time.time() < end:
        for _ in range(1000):
            x = x * 1.0001 + 0.0001
        _sync(torch)
        steps += 1
    return steps


class _Heavy:
    """A dataset whose items take CPU time to make, like decoding and augmenting images."""

    def __init__(self, dim: int, rounds: int) -> None:
        self.dim, self.rounds = dim, rounds

    def __len__(self) -> int:
        return 10**7

    def __getitem__(self, i: int) -> tuple[object, int]:
        import numpy as np
        import torch

        x = np.random.default_rng(i).random(self.dim, dtype=np.float32)
        for _ in range(self.rounds):
            x = np.tanh(x * 1.01) + 0.001 * np.cos(x)
        return torch.from_numpy(x), i % 100


def loader_workers(dev: object, end: float, workers: int, size: int) -> int:
    """A model step fed by ``workers`` DataLoader processes (pinned memory, prefetch) whose items are costly."""
    import torch
    from torch.utils.data import DataLoader

    model = torch.nn.Sequential(torch.nn.Linear(size, size), torch.nn.ReLU(), torch.nn.Linear(size, 100)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(
        _Heavy(size, 30),
        batch_size=128,
        num_workers=workers,
        pin_memory=True,
        persistent_workers=True,
        prefetch_factor=4,
    )
    steps = 0
    for x, y in loader:
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        for _ in range(6):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        steps += 1
        if time.time() > end:
            break
    _sync(torch)
    return steps


def self_paused(dev: object, end: float, busy: float, pause: float, size: int) -> int:
    """bf16 matrix products for ``busy`` seconds, then a sleep of ``pause`` seconds, the CPU idle too."""
    import torch

    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    steps = 0
    while time.time() < end:
        until = time.time() + busy
        while time.time() < until:
            for _ in range(10):
                a @ a
            _sync(torch)
        time.sleep(pause)
        steps += 1
    return steps


def d2d_copy(dev: object, end: float, size: int) -> int:
    """Copies between two device tensors of ``size`` MiB."""
    import torch

    a = torch.empty(size * 1024 * 1024, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    steps = 0
    while time.time() < end:
        for _ in range(20):
            b.copy_(a)
        _sync(torch)
        steps += 1
    return steps


def elementwise(dev: object, end: float, size: int) -> int:
    """``a * b + c`` over fp32 tensors of ``size`` M elements: bytes moved per flop far above the ridge point."""
    import torch

    a, b, c = (torch.randn(size * 1024 * 1024, device=dev) for _ in range(3))
    steps = 0
    while time.time() < end:
        for _ in range(20):
            torch.addcmul(c, a, b)
        _sync(torch)
        steps += 1
    return steps


def matmul(dev: object, end: float, size: int, dtype: str) -> int:
    """Back-to-back matrix products of ``size`` square matrices; fp32 with TF32 off keeps the tensor cores idle."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    a = torch.randn(size, size, device=dev, dtype=getattr(torch, dtype))
    steps = 0
    while time.time() < end:
        for _ in range(10):
            a @ a
        _sync(torch)
        steps += 1
    return steps


def pinned_h2d(dev: object, end: float, size: int) -> int:
    """Copies of a pinned host buffer of ``size`` MiB to the GPU."""
    import torch

    host = torch.empty(size * 1024 * 1024, dtype=torch.uint8).pin_memory()
    steps = 0
    while time.time() < end:
        host.to(dev, non_blocking=True)
        _sync(torch)
        steps += 1
    return steps


def io_reader(dev: object, end: float, size: int, path: str = "/tmp/gpuwarden-io") -> int:
    """Reads ``size`` MiB files from storage with O_DIRECT (no page cache) before each small GPU step."""
    import mmap

    import torch

    os.makedirs(path, exist_ok=True)
    files = []
    for i in range(4):
        f = os.path.join(path, f"shard{i}")
        if not os.path.exists(f) or os.path.getsize(f) != size * 1024 * 1024:
            with open(f, "wb") as out:
                out.write(os.urandom(size * 1024 * 1024))
        files.append(f)
    model = torch.nn.Linear(4096, 4096).to(dev)
    buf = mmap.mmap(-1, 1024 * 1024)
    steps = 0
    while time.time() < end:
        for f in files:
            fd = os.open(f, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
            try:
                while os.readv(fd, [buf]) > 0:
                    pass
            finally:
                os.close(fd)
            x = torch.randn(1024, 4096, device=dev)
            model(x).sum().backward()
            _sync(torch)
            steps += 1
    return steps


def host_optimizer(dev: object, end: float, size: int) -> int:
    """An MLP of four ``size`` x ``size`` layers: forward and backward on the GPU, gradients copied to pinned host
    memory, Adam stepped on the CPU (CPU-offloaded optimizer), parameters copied back. The host step is the limit."""
    import torch

    model = torch.nn.Sequential(*[torch.nn.Linear(size, size) for _ in range(4)]).to(dev)
    host = [p.detach().cpu().pin_memory().requires_grad_(True) for p in model.parameters()]
    opt = torch.optim.Adam(host, lr=1e-4)
    x = torch.randn(256, size, device=dev)
    steps = 0
    while time.time() < end:
        model(x).square().mean().backward()
        for h, p in zip(host, model.parameters(), strict=True):
            h.grad = p.grad.to("cpu", non_blocking=True)
            p.grad = None
        _sync(torch)
        opt.step()
        with torch.no_grad():
            for h, p in zip(host, model.parameters(), strict=True):
                p.copy_(h, non_blocking=True)
        steps += 1
    return steps


def host_metrics(dev: object, end: float, size: int) -> int:
    """A bf16 matrix step on the GPU, then its ``size`` x ``size`` output copied to the host and metrics (sort,
    histogram, ranks) computed there with NumPy before the next step: the host consumes the GPU's output."""
    import numpy as np
    import torch

    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    steps = 0
    while time.time() < end:
        out = (a @ a).float().cpu().numpy()
        np.histogram(out, bins=256)
        np.argsort(out, axis=1)
        steps += 1
    return steps


def run(a: argparse.Namespace) -> int:
    """Run scenario ``a.scenario`` until ``a.seconds`` have passed; return its step count."""
    import torch

    dev = torch.device(f"cuda:{a.gpu}")
    torch.cuda.set_device(dev)
    end = time.time() + a.seconds
    s = a.scenario
    if s == "launch_bound":
        return launch_bound(dev, end, a.size or 1024)
    if s == "loader_workers":
        return loader_workers(dev, end, a.workers, a.size or 4096)
    if s == "self_paused":
        return self_paused(dev, end, a.busy, a.pause, a.size or 8192)
    if s == "d2d_copy":
        return d2d_copy(dev, end, a.size or 2048)
    if s == "elementwise":
        return elementwise(dev, end, a.size or 256)
    if s == "fp32_matmul":
        return matmul(dev, end, a.size or 8192, "float32")
    if s == "bf16_matmul":
        return matmul(dev, end, a.size or 8192, "bfloat16")
    if s == "pinned_h2d":
        return pinned_h2d(dev, end, a.size or 256)
    if s == "io_reader":
        return io_reader(dev, end, a.size or 256)
    if s == "host_optimizer":
        return host_optimizer(dev, end, a.size or 4096)
    if s == "host_metrics":
        return host_metrics(dev, end, a.size or 4096)
    raise SystemExit(f"unknown scenario {s!r}; see: workloads.py list")


def main() -> None:
    """Parse the command line and run or list the scenarios."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="print the scenarios")
    r = sub.add_parser("run", help="run one scenario")
    r.add_argument("scenario", choices=sorted(SCENARIOS))
    r.add_argument("--seconds", type=float, default=30.0)
    r.add_argument("--gpu", type=int, default=0)
    r.add_argument("--size", type=int, default=0, help="scenario's size knob (0: its default)")
    r.add_argument("--workers", type=int, default=8)
    r.add_argument("--busy", type=float, default=1.0)
    r.add_argument("--pause", type=float, default=1.0)
    a = p.parse_args()
    if a.cmd == "list":
        for k, v in SCENARIOS.items():
            print(f"{k:16s} {v}")
        return
    t0 = time.time()
    steps = run(a)
    knobs = {k: getattr(a, k) for k in ("size", "workers", "busy", "pause")}
    out = {"scenario": a.scenario, **knobs, "seconds": round(time.time() - t0, 2), "steps": steps, "pid": os.getpid()}
    print(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

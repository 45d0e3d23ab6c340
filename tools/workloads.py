#!/usr/bin/env python3
"""GPU workloads with a known cause of (low) utilization, for recording traces and checking the diagnosis.

    python3 tools/workloads.py list
    python3 tools/workloads.py run SCENARIO [--seconds S] [--gpu N] [--size N] [--workers N] [--busy S] [--pause S]
        [--startup S]

Each scenario stands for one kind of workload the diagnosis names; the knobs make variants of it (other sizes,
worker counts, duty cycles), so a rule is checked on more than the one recording it was written from. Needs
PyTorch and an NVIDIA GPU. Prints one JSON line at the end: scenario, knobs, seconds, steps, pid.

Each workload also keeps its own clock: the wall time of each phase of its loop (``gpu``: a GPU step until it is
synchronized; ``copy``: copies between host and GPU (copy engines, no kernel); ``input``: waiting for the next batch
prepared on the CPU; ``read``: reading input from storage or a remote server; ``host``: work on the GPU's output on
the CPU; ``checkpoint``: writing a checkpoint; ``sleep``: the job
itself idle), per whole Unix second, written with ``--split-out FILE`` as JSON. ``tools/accounting_check.py``
compares it with gpuwarden's idle seconds by cause over the same seconds of a recording.

    python3 tools/workloads.py serve-bytes --port P [--rate MBPS]   # the "remote storage" of remote_reader
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import serving_workloads as serving

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
    "mid_kernels": "eager elementwise kernels of --size elements each, launched one after another by one busy thread"
    " (on the H100 they run about 1% of the SMs' time: tiny kernels, launch bound)",
    "mid_gemms": "eager batched bf16 products of --size 128x4096 by 4096x128 pairs (one 128x128 output tile each: a"
    " grid of about --size blocks), launched one after another by one busy thread: kernels covering part of the SMs",
    "mid_sorts": "eager sorts of --size rows of 4096 floats (one block per row), launched one after another by one"
    " busy thread: kernels covering part of the SMs",
    "checkpoint_writer": "bf16 training steps for --busy seconds, then the model's --size MiB written to a checkpoint"
    " file (device-to-host copy, serialise, fsync) while the GPU waits",
    "remote_reader": "each batch read over TCP from serve-bytes (--port; --size KiB per request, --workers readers):"
    " input from remote storage, the processes sleeping on sockets",
    "service": "a model server: requests arrive every --pause seconds (jittered), each a --busy second GPU batch:"
    " the GPU a few percent busy with short requests",
    "eval_metrics": "training steps for --busy seconds, then an evaluation: predictions of --size rows copied to the"
    " host and ranking metrics computed there in NumPy for about --pause seconds while the GPU idles",
    "copy_compute": "each step a --size MiB batch copied from pageable host memory to the GPU (blocking: the CPU"
    " stages it, the GPU waits), then --busy seconds of bf16 products: copies beside compute",
    "pinned_copy_compute": "as copy_compute, the batch in pinned memory (a faster blocking copy, the GPU still waits)",
    "inference_server": "an HTTP model server on --port (0.0.0.0) holding --size MiB of KV cache, each request --busy"
    " seconds of bf16 products; a client process sends requests --pause seconds apart on average (Poisson), or every"
    " --pause seconds (--arrivals fixed); --engine child: the GPU work in a child process behind the front end (vLLM's"
    " V1 engine, TorchServe, Triton's Python backend); --proto grpc: a gRPC server (grpcio) instead of HTTP",
    "stopped_cycles": "bf16 training steps in a child process that its parent stops (SIGSTOP) for --pause seconds"
    " after every --busy seconds and then continues (SIGCONT): a job suspended part of the time",
    "d2h_copy": "each step --busy seconds of bf16 products, then a --size MiB result copied to pageable host memory"
    " (blocking): device-to-host copies while the GPU waits",
    "pinned_d2h_copy": "as d2h_copy, into pinned host memory",
    "host_phase": "bf16 products for --busy seconds, then --pause seconds of NumPy work on the host (sorts: one"
    " core) while the GPU idles: a mostly busy job with a host phase (evaluation metrics, logging)",
    "kernel_idle": "a notebook kernel's shape: --size MiB held, five loopback sockets listening on ports bind(0) gave"
    " (a Jupyter kernel's ZMQ channels), no GPU work",
    "distributed_paused": "torch.distributed (NCCL, one rank: its store listens on MASTER_PORT, NCCL's bootstrap on an"
    " ephemeral port) computing --busy seconds, then pausing --pause seconds: a training job, not a server",
    "overlapped_copy_compute": "as pinned_copy_compute, each next batch copied on a side stream (non_blocking) under"
    " this step's products: the remedy, copies hidden behind compute",
}


class Split:
    """The workload's own clock: wall seconds per phase per whole Unix second (``to(phase)`` starts a phase)."""

    def __init__(self) -> None:
        self.bins: dict[int, dict[str, float]] = {}
        self.phase: str | None = None
        self.t = time.time()

    def to(self, phase: str | None) -> None:
        """End the current phase now and start ``phase`` (None: stop the clock)."""
        now = time.time()
        if self.phase is not None:
            a = self.t
            while a < now:
                b = min(now, float(int(a) + 1))
                row = self.bins.setdefault(int(a), {})
                row[self.phase] = row.get(self.phase, 0.0) + (b - a)
                a = b
        self.phase, self.t = phase, now

    def dump(self, path: str, meta: dict[str, object]) -> None:
        """Write the bins (seconds rounded to 0.1 ms) and ``meta`` to ``path`` as JSON."""
        self.to(None)
        bins = {str(k): {p: round(v, 4) for p, v in row.items()} for k, row in sorted(self.bins.items())}
        with open(path, "w") as f:
            json.dump({**meta, "phases": sorted({p for r in self.bins.values() for p in r}), "bins": bins}, f)


CLOCK = Split()


def _sync(torch: object) -> None:
    torch.cuda.synchronize()  # type: ignore[attr-defined]


def launch_bound(dev: object, end: float, size: int) -> int:
    """Tiny elementwise kernels, one launch each, no batching: each kernel runs microseconds, each launch costs
    the CPU thread several microseconds more. Its clock: all ``gpu`` (the thread launches without a stop)."""
    import torch

    x = torch.ones(size, device=dev)
    steps = 0
    CLOCK.to("gpu")
    while time.time() < end:
        for _ in range(1000):
            x = x * 1.0001 + 0.0001
        _sync(torch)
        steps += 1
    return steps


def mid_kernels(dev: object, end: float, size: int) -> int:
    """``x * 1.0001 + 0.0001`` and ``torch.tanh`` on ``size`` fp32 elements, one kernel per call: PyTorch's
    vectorised elementwise kernel gives each block of 128 threads 512 elements, so 22,528 elements make 44 blocks
    (a third of an H100's 132 SMs). Each kernel runs about a microsecond (SM activity 1-4% of util.gpu on the
    H100): tiny kernels rather than mid-size ones; the Python thread launching them is the limit. Clock: ``gpu``."""
    import torch

    x = torch.rand(size, device=dev)
    steps = 0
    CLOCK.to("gpu")
    while time.time() < end:
        for _ in range(500):
            x = torch.tanh(x * 1.0001 + 0.0001)
        _sync(torch)
        steps += 1
    return steps


def mid_gemms(dev: object, end: float, size: int) -> int:
    """``torch.bmm`` of ``size`` pairs of bf16 (128 x 4096) by (4096 x 128) matrices: one 128 x 128 output tile per
    pair, a grid of about ``size`` blocks (cuBLAS picks the tiling), each running tens of microseconds. Clock:
    ``gpu``."""
    import torch

    a = torch.randn(size, 128, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(size, 4096, 128, device=dev, dtype=torch.bfloat16)
    return _gpu_loop(torch, end, lambda: [torch.bmm(a, b) for _ in range(200)])


def mid_sorts(dev: object, end: float, size: int) -> int:
    """``torch.sort`` of ``size`` rows of 4096 fp32 values along the rows: one block sorts one row in shared
    memory, a grid of ``size`` blocks. Clock: ``gpu``."""
    import torch

    x = torch.rand(size, 4096, device=dev)
    return _gpu_loop(torch, end, lambda: [torch.sort(x, dim=1) for _ in range(200)])


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
    """A model step fed by ``workers`` DataLoader processes (pinned memory, prefetch) whose items are costly;
    ``workers`` 0: the items are made in the training process itself. Clock: ``input`` waiting for the next batch,
    ``gpu`` the step until synchronized."""
    import torch
    from torch.utils.data import DataLoader

    model = torch.nn.Sequential(torch.nn.Linear(size, size), torch.nn.ReLU(), torch.nn.Linear(size, 100)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    extra = {"persistent_workers": True, "prefetch_factor": 4} if workers else {}
    loader = DataLoader(_Heavy(size, 30), batch_size=128, num_workers=workers, pin_memory=True, **extra)
    steps = 0
    CLOCK.to("input")
    for x, y in loader:
        CLOCK.to("gpu")
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        for _ in range(6):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        _sync(torch)
        steps += 1
        CLOCK.to("input")
        if time.time() > end:
            break
    return steps


def self_paused(dev: object, end: float, busy: float, pause: float, size: int) -> int:
    """bf16 matrix products for ``busy`` seconds, then a sleep of ``pause`` seconds, the CPU idle too.
    Clock: ``gpu``, ``sleep``."""
    import torch

    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    steps = 0
    while time.time() < end:
        CLOCK.to("gpu")
        until = time.time() + busy
        while time.time() < until:
            for _ in range(10):
                a @ a
            _sync(torch)
        CLOCK.to("sleep")
        time.sleep(pause)
        steps += 1
    return steps


def _gpu_loop(torch: object, end: float, body: object) -> int:
    """Run ``body()`` then synchronize until ``end``, the clock on ``gpu``; return the count."""
    steps = 0
    CLOCK.to("gpu")
    while time.time() < end:
        body()  # type: ignore[operator]
        _sync(torch)
        steps += 1
    return steps


def d2d_copy(dev: object, end: float, size: int) -> int:
    """Copies between two device tensors of ``size`` MiB. Clock: ``gpu``."""
    import torch

    a = torch.empty(size * 1024 * 1024, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    return _gpu_loop(torch, end, lambda: [b.copy_(a) for _ in range(20)])


def elementwise(dev: object, end: float, size: int) -> int:
    """``a * b + c`` over fp32 tensors of ``size`` M elements: bytes moved per flop far above the ridge point."""
    import torch

    a, b, c = (torch.randn(size * 1024 * 1024, device=dev) for _ in range(3))
    return _gpu_loop(torch, end, lambda: [torch.addcmul(c, a, b) for _ in range(20)])


def matmul(dev: object, end: float, size: int, dtype: str) -> int:
    """Back-to-back matrix products of ``size`` square matrices; fp32 with TF32 off keeps the tensor cores idle."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    a = torch.randn(size, size, device=dev, dtype=getattr(torch, dtype))
    return _gpu_loop(torch, end, lambda: [a @ a for _ in range(10)])


def pinned_h2d(dev: object, end: float, size: int) -> int:
    """Copies of a pinned host buffer of ``size`` MiB to the GPU. Clock: ``gpu`` (the copy engine works; util.gpu
    does not count copies, so gpuwarden sees this time idle: the h2d_copy_bound verdict names it)."""
    import torch

    host = torch.empty(size * 1024 * 1024, dtype=torch.uint8).pin_memory()
    return _gpu_loop(torch, end, lambda: host.to(dev, non_blocking=True))


def io_reader(dev: object, end: float, size: int, path: str = "/tmp/gpuwarden-io") -> int:
    """Reads ``size`` MiB files from storage with O_DIRECT (no page cache) before each small GPU step.
    Clock: ``read``, ``gpu``."""
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
            CLOCK.to("read")
            fd = os.open(f, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
            try:
                while os.readv(fd, [buf]) > 0:
                    pass
            finally:
                os.close(fd)
            CLOCK.to("gpu")
            x = torch.randn(1024, 4096, device=dev)
            model(x).sum().backward()
            _sync(torch)
            steps += 1
    return steps


def host_optimizer(dev: object, end: float, size: int) -> int:
    """An MLP of four ``size`` x ``size`` layers: forward and backward on the GPU, gradients copied to pinned host
    memory, Adam stepped on the CPU (CPU-offloaded optimizer), parameters copied back. The host step is the limit.
    Clock: ``gpu`` (forward, backward), ``copy`` (gradients out), ``host`` (the Adam step), ``copy`` (parameters
    back): copies run on the copy engines, not as kernels."""
    import torch

    model = torch.nn.Sequential(*[torch.nn.Linear(size, size) for _ in range(4)]).to(dev)
    host = [p.detach().cpu().pin_memory().requires_grad_(True) for p in model.parameters()]
    opt = torch.optim.Adam(host, lr=1e-4)
    x = torch.randn(256, size, device=dev)
    steps = 0
    while time.time() < end:
        CLOCK.to("gpu")
        model(x).square().mean().backward()
        _sync(torch)
        CLOCK.to("copy")
        for h, p in zip(host, model.parameters(), strict=True):
            h.grad = p.grad.to("cpu", non_blocking=True)
            p.grad = None
        _sync(torch)
        CLOCK.to("host")
        opt.step()
        CLOCK.to("copy")
        with torch.no_grad():
            for h, p in zip(host, model.parameters(), strict=True):
                p.copy_(h, non_blocking=True)
        _sync(torch)
        steps += 1
    return steps


def host_metrics(dev: object, end: float, size: int) -> int:
    """A bf16 matrix step on the GPU, then its ``size`` x ``size`` output copied to the host and metrics (sort,
    histogram, ranks) computed there with NumPy before the next step: the host consumes the GPU's output.
    Clock: ``gpu`` (the step), ``copy`` (the output to the host), ``host``."""
    import numpy as np
    import torch

    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    steps = 0
    while time.time() < end:
        CLOCK.to("gpu")
        out = (a @ a).float()
        _sync(torch)
        CLOCK.to("copy")
        out = out.cpu().numpy()
        CLOCK.to("host")
        np.histogram(out, bins=256)
        np.argsort(out, axis=1)
        steps += 1
    return steps


def ranking_metrics(scores: object, labels: object, seconds: float) -> float:
    """Ranking metrics of an evaluation on the host (NumPy): per-row ranks of the true label and a mean reciprocal
    rank, repeated over bootstrap resamples until ``seconds`` have passed (the evaluation's own cost). Clock:
    ``host``."""
    import numpy as np

    rng = np.random.default_rng(0)
    end = time.time() + seconds
    mrr = 0.0
    while time.time() < end:
        rows = rng.integers(0, len(scores), len(scores))  # type: ignore[arg-type]
        s = scores[rows]  # type: ignore[index]
        order = np.argsort(-s, axis=1)
        rank = np.argmax(order == labels[rows, None], axis=1) + 1  # type: ignore[index]
        mrr = float(np.mean(1.0 / rank))
    return mrr


def eval_metrics(dev: object, end: float, busy: float, pause: float, size: int) -> int:
    """An MLP trained in bf16 for ``busy`` seconds, then evaluated: predictions for ``size`` rows (1,000 classes)
    made on the GPU, copied to the host, and ranked there (``ranking_metrics``) for ``pause`` seconds while the GPU
    idles and one core works - evaluation with host-side metrics, not input. Clock: ``gpu``, ``copy``, ``host``."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1000))
    model = model.to(dev, dtype=torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(2048, 4096, device=dev, dtype=torch.bfloat16)
    y = torch.randint(0, 1000, (2048,), device=dev)
    steps = 0
    while time.time() < end:
        CLOCK.to("gpu")
        phase = time.time() + busy
        while time.time() < phase:
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
        with torch.no_grad():
            preds = torch.cat([model(x).float() for _ in range(max(1, size // 2048))])
        _sync(torch)
        CLOCK.to("copy")
        scores, labels = preds.cpu().numpy(), y.repeat(max(1, size // 2048)).cpu().numpy()
        CLOCK.to("host")
        ranking_metrics(scores, labels, pause)
    return steps


def copy_compute(dev: object, end: float, busy: float, size: int, mode: str) -> int:
    """Each step: a ``size`` MiB bf16 batch on the host copied to the GPU, then bf16 products of 8192-square matrices
    for ``busy`` seconds (synchronised every ten). ``mode`` ``pageable``: a blocking copy from pageable memory (the
    driver stages it through a pinned buffer: a core copies, the GPU idles); ``pinned``: a blocking copy from pinned
    memory (DMA at the link's rate, the GPU idles); ``overlapped``: pinned, the next batch copied on a side stream
    with ``non_blocking`` while this step computes (the GPU waits only where a copy outlasts the step). Clock:
    ``copy``, ``gpu``."""
    import torch

    host = torch.full((size * 1024 * 1024 // 2,), 0.5, dtype=torch.bfloat16)  # made in a second, even 4 GiB
    if mode != "pageable":
        host = host.pin_memory()
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) / 90.0
    side = torch.cuda.Stream(dev) if mode == "overlapped" else None
    batch = host.to(dev)
    steps = 0
    while time.time() < end:
        CLOCK.to("copy")
        if side is None:
            batch = host.to(dev)
            _sync(torch)
        else:
            torch.cuda.current_stream(dev).wait_stream(side)  # the batch copied under the last step
            nxt = torch.empty_like(batch)
            with torch.cuda.stream(side):
                nxt.copy_(host, non_blocking=True)
        CLOCK.to("gpu")
        phase = time.time() + busy
        x = a + batch[0] * 0  # this step computes on its batch
        while time.time() < phase:
            for _ in range(10):
                x = (x @ a).clamp_(-1, 1)
            _sync(torch)
        if side is not None:
            batch = nxt
        steps += 1
    return steps


def host_phase(dev: object, end: float, busy: float, pause: float) -> int:
    """bf16 products of 8192-square matrices for ``busy`` seconds (synchronised every ten), then ``pause`` seconds of
    sorts of random arrays in NumPy on one core while the GPU idles. Clock: ``gpu``, ``host``."""
    import numpy as np
    import torch

    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) / 90.0
    rng = np.random.default_rng(3)
    steps = 0
    while time.time() < end:
        CLOCK.to("gpu")
        x, until = a, time.time() + busy
        while time.time() < until:
            for _ in range(10):
                x = (x @ a).clamp_(-1, 1)
            _sync(torch)
        CLOCK.to("host")
        until = time.time() + pause
        while time.time() < until:
            np.sort(rng.random(200_000))
        steps += 1
    return steps


def kernel_idle(dev: object, end: float, size: int) -> int:
    """A notebook kernel between cells: ``size`` MiB held on the GPU, five sockets listening on 127.0.0.1 on ports
    bind(0) gave (a Jupyter kernel's shell, iopub, stdin, control and heartbeat channels), nothing running. Clock:
    ``sleep``."""
    import socket

    import torch

    held = torch.empty(size * 1024 * 1024, dtype=torch.uint8, device=dev)  # noqa: F841 - the notebook's tensors
    socks = []
    for _ in range(5):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()
        socks.append(s)
    CLOCK.to("sleep")
    while time.time() < end:
        time.sleep(0.5)
    return 0


def distributed_paused(dev: object, end: float, busy: float, pause: float) -> int:
    """One rank of torch.distributed over NCCL (MASTER_ADDR 127.0.0.1, MASTER_PORT: its TCPStore listens there; an
    all-reduce makes NCCL open its bootstrap socket on an ephemeral port), computing bf16 products for ``busy``
    seconds, then sleeping ``pause`` seconds: a training job that listens on ports, not a server. Clock: ``gpu``,
    ``sleep``."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method="env://", rank=0, world_size=1, device_id=dev)
    t = torch.ones(1024, device=dev)
    dist.all_reduce(t)
    _sync(torch)
    return self_paused(dev, end, busy, pause, 8192)


def build_model(seconds: float) -> None:
    """A job's start-up after its CUDA context exists: the model built and initialised on the CPU (one thread) for
    ``seconds``, the GPU idle, as imports, model construction and checkpoint loading are."""
    import torch

    torch.set_num_threads(1)
    end = time.time() + seconds
    w = torch.empty(1024, 1024)
    while time.time() < end:
        torch.nn.init.kaiming_uniform_(w)
        w = w @ w.T / 1024


def checkpoint_writer(dev: object, end: float, busy: float, size: int, path: str = "/tmp/gpuwarden-ckpt") -> int:
    """bf16 products for ``busy`` seconds, then a checkpoint: a ``size`` MiB state copied to the host, serialised
    with torch.save to a file and fsync'ed, the GPU waiting. Clock: ``gpu``, ``checkpoint``."""
    import torch

    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    state = {f"w{i}": torch.randn(size * 1024 * 1024 // 4 // 8, device=dev) for i in range(8)}
    os.makedirs(path, exist_ok=True)
    target = os.path.join(path, "ckpt.pt")
    steps = 0
    while time.time() < end:
        CLOCK.to("gpu")
        until = time.time() + busy
        while time.time() < until:
            for _ in range(20):
                a @ a
            _sync(torch)
        CLOCK.to("checkpoint")
        with open(target, "wb") as f:
            torch.save({k: v.cpu() for k, v in state.items()}, f)
            f.flush()
            os.fsync(f.fileno())
        steps += 1
    return steps


def _fetch(port: int, kib: int) -> bytes:
    """One request to serve-bytes on localhost ``port``: ``kib`` KiB back."""
    import socket

    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(f"{kib}\n".encode())
        chunks, want = [], kib * 1024
        while want > 0:
            c = s.recv(min(want, 1 << 20))
            if not c:
                break
            chunks.append(c)
            want -= len(c)
        return b"".join(chunks)


class _Remote:
    """A dataset whose items are fetched from serve-bytes (a stand-in for an object store or a network file system:
    the bytes come through a socket, not from local storage)."""

    def __init__(self, port: int, kib: int) -> None:
        self.port, self.kib = port, kib

    def __len__(self) -> int:
        return 10**7

    def __getitem__(self, i: int) -> object:
        import numpy as np
        import torch

        raw = np.frombuffer(_fetch(self.port, self.kib), dtype=np.uint8)
        return torch.from_numpy(raw[: 4096 * (raw.size // 4096)].astype(np.float32).reshape(-1, 4096)[:4].copy())


def remote_reader(dev: object, end: float, workers: int, size: int, port: int) -> int:
    """A small model step on batches of 8 items, each ``size`` KiB fetched from serve-bytes on ``port`` by
    ``workers`` DataLoader processes (0: by the training process). Clock: ``read`` waiting for the batch, ``gpu``."""
    import torch
    from torch.utils.data import DataLoader

    model = torch.nn.Linear(4096, 4096).to(dev)
    extra = {"persistent_workers": True, "prefetch_factor": 2} if workers else {}
    loader = DataLoader(_Remote(port, size), batch_size=8, num_workers=workers, **extra)
    steps = 0
    CLOCK.to("read")
    for x in loader:
        CLOCK.to("gpu")
        x = x.to(dev).reshape(-1, 4096)
        for _ in range(4):
            model(x).sum().backward()
        _sync(torch)
        steps += 1
        CLOCK.to("read")
        if time.time() > end:
            break
    return steps


def service(dev: object, end: float, busy: float, pause: float, size: int) -> int:
    """Requests every ``pause`` seconds (uniformly jittered by half), each ``busy`` seconds of bf16 products of
    ``size`` square matrices: the GPU a few percent busy in short bursts. Clock: ``gpu``, ``sleep``."""
    import random

    import torch

    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    rng = random.Random(7)
    steps = 0
    while time.time() < end:
        CLOCK.to("sleep")
        time.sleep(pause * rng.uniform(0.5, 1.5))
        CLOCK.to("gpu")
        until = time.time() + busy
        while time.time() < until:
            a @ a
            _sync(torch)
        steps += 1
    return steps


def serve_bytes(port: int, rate_mbps: float, latency: float) -> None:
    """Serve ``N\n`` requests on localhost ``port`` with N KiB of bytes, after ``latency`` seconds, sent at
    ``rate_mbps`` MB/s per connection (0: as fast as possible): a remote store's latency and bandwidth."""
    import socketserver

    block = os.urandom(1 << 20)

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            kib = int(self.rfile.readline() or b"0")
            time.sleep(latency)
            left = kib * 1024
            while left > 0:
                n = min(left, 64 * 1024)
                self.wfile.write(block[:n])
                left -= n
                if rate_mbps > 0:
                    time.sleep(n / (rate_mbps * 1e6))

    socketserver.ThreadingTCPServer.allow_reuse_address = True
    with socketserver.ThreadingTCPServer(("127.0.0.1", port), Handler) as srv:
        srv.daemon_threads = True
        srv.serve_forever()


def run(a: argparse.Namespace) -> int:
    """Run scenario ``a.scenario`` until ``a.seconds`` have passed; return its step count."""
    if a.scenario == "inference_server":  # the front end touches no GPU where its engine is a child
        return serving.serve(a.gpu, time.time() + a.seconds, a.busy, a.pause, a.size or 8192, a.port, a.host,
                             a.arrivals, a.engine, a.proto, CLOCK)  # fmt: skip
    if a.scenario == "stopped_cycles":
        return serving.stopped_cycles(a.gpu, time.time() + a.seconds, a.busy, a.pause, CLOCK)
    if a.scenario == "distributed_paused" and "MASTER_PORT" not in os.environ:
        # torch.distributed's env:// rendezvous, in the process's own environment (as torchrun sets it)
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511", "RANK": "0", "WORLD_SIZE": "1"}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    import torch

    dev = torch.device(f"cuda:{a.gpu}")
    torch.cuda.set_device(dev)
    if a.startup:
        torch.zeros(1, device=dev)  # the CUDA context: the process holds the GPU from here
        build_model(a.startup)
        torch.set_num_threads(os.cpu_count() or 1)
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
    if s == "mid_kernels":
        return mid_kernels(dev, end, a.size or 22528)
    if s == "mid_gemms":
        return mid_gemms(dev, end, a.size or 44)
    if s == "mid_sorts":
        return mid_sorts(dev, end, a.size or 44)
    if s == "checkpoint_writer":
        return checkpoint_writer(dev, end, a.busy, a.size or 1024)
    if s == "remote_reader":
        return remote_reader(dev, end, a.workers, a.size or 1024, a.port)
    if s == "service":
        return service(dev, end, a.busy, a.pause, a.size or 4096)
    if s == "eval_metrics":
        return eval_metrics(dev, end, a.busy, a.pause, a.size or 16384)
    if s in ("d2h_copy", "pinned_d2h_copy"):
        return serving.d2h_copy(dev, end, a.busy, a.size or 1024, s == "pinned_d2h_copy", CLOCK)
    if s == "host_phase":
        return host_phase(dev, end, a.busy, a.pause)
    if s == "kernel_idle":
        return kernel_idle(dev, end, a.size or 8192)
    if s == "distributed_paused":
        return distributed_paused(dev, end, a.busy, a.pause)
    if s in ("copy_compute", "pinned_copy_compute", "overlapped_copy_compute"):
        return copy_compute(dev, end, a.busy, a.size or 1024, s.removesuffix("copy_compute").rstrip("_") or "pageable")
    raise SystemExit(f"unknown scenario {s!r}; see: workloads.py list")


def main() -> None:
    """Parse the command line and run or list the scenarios."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="print the scenarios")
    sb = sub.add_parser("serve-bytes", help="serve bytes over TCP for remote_reader")
    sb.add_argument("--port", type=int, default=10500)
    sb.add_argument("--rate", type=float, default=0.0, help="MB/s per connection (0: unlimited)")
    sb.add_argument("--latency", type=float, default=0.0, help="seconds before each reply")
    r = sub.add_parser("run", help="run one scenario")
    r.add_argument("scenario", choices=sorted(SCENARIOS))
    r.add_argument("--seconds", type=float, default=30.0)
    r.add_argument("--gpu", type=int, default=0)
    r.add_argument("--size", type=int, default=0, help="scenario's size knob (0: its default)")
    r.add_argument("--workers", type=int, default=8)
    r.add_argument("--busy", type=float, default=1.0)
    r.add_argument("--pause", type=float, default=1.0)
    r.add_argument("--host", default="0.0.0.0", help="the address the server binds (inference_server)")
    r.add_argument("--arrivals", choices=("poisson", "fixed"), default="poisson", help="inference_server's requests")
    r.add_argument("--engine", choices=("inproc", "child"), default="inproc", help="inference_server's GPU process")
    r.add_argument("--proto", choices=("http", "grpc"), default="http", help="inference_server's protocol")
    r.add_argument(
        "--port",
        type=int,
        default=10500,
        help="serve-bytes's port (remote_reader); the server's port (inference_server)",
    )
    r.add_argument("--split-out", help="write the workload's own clock (seconds per phase per second) here")
    r.add_argument("--startup", type=float, default=0.0, help="seconds of start-up (model built on the CPU) first")
    a = p.parse_args()
    if a.cmd == "list":
        for k, v in SCENARIOS.items():
            print(f"{k:18s} {v}")
        return
    if a.cmd == "serve-bytes":
        serve_bytes(a.port, a.rate, a.latency)
        return
    t0 = time.time()
    steps = run(a)
    knobs = {k: getattr(a, k) for k in ("size", "workers", "busy", "pause")}
    out = {"scenario": a.scenario, **knobs, "seconds": round(time.time() - t0, 2), "steps": steps, "pid": os.getpid()}
    if a.split_out:
        CLOCK.dump(a.split_out, out)
    print(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Replayed traces for the benchmark: the real recordings, and N-GPU traces derived from them at bench time.

No node with 8 or 64 GPUs was available to record, so ``derive_trace(n, out_dir)`` builds an ``n``-GPU trace
from the recorded GPUs of the repository: the two H200s of ``h200x2-ddp_straggler`` and the six single-H100
scenario traces (8 distinct recorded GPUs). GPU ``i`` is recorded GPU ``i mod 8`` with index ``i``, a new UUID,
serial, PCI bus id and minor number, and its process PIDs offset by ``100000 * (i // 8)`` so that copies do
not merge into one job; its readings are otherwise the recorded ones, re-timed onto the H200 trace's poll
times. The header says so in ``metadata.modified``. Traces are written to a temporary directory and not kept.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from gpuwarden.model import GpuReading, GpuStatic, PollResult
from gpuwarden.trace import TraceHeader, TraceWriter, read_trace

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO / "tests" / "data" / "traces"
BASE = TRACES / "h200x2-ddp_straggler.jsonl.gz"
#: The six single-H100 scenario recordings (with the two H200s: 8 distinct recorded GPUs).
H100 = [
    TRACES / f"h100-{s}.jsonl.gz"
    for s in ("compute_bound", "h2d_pageable_copy", "held_idle", "idle", "starved_cpu_heavy", "starved_dataloader")
]
#: The real single-GPU trace used for the 1-GPU configuration (not derived).
ONE_GPU = TRACES / "h100-compute_bound.jsonl.gz"
_NAMESPACE = uuid.UUID("0d5b8f64-4b8e-4c55-b1c4-6a3a7d2e9f10")
_PID_STRIDE = 100_000


def _pool() -> tuple[TraceHeader, list[PollResult], list[tuple[str, GpuStatic, list[PollResult]]]]:
    """Return the base trace and every recorded GPU as (source name, static, polls of its trace)."""
    header, polls = read_trace(BASE)
    pool = [(BASE.name, s, polls) for s in header.node.gpus]
    for path in H100:
        h, p = read_trace(path)
        pool.extend((path.name, s, p) for s in h.node.gpus)
    return header, polls, pool


def _gpu_at(polls: list[PollResult], j: int, index: int) -> tuple[GpuReading, float]:
    poll = polls[j % len(polls)]
    return next(g for g in poll.gpus if g.index == index), poll.timestamp


def derive_trace(n: int, out_dir: Path) -> Path:
    """Write ``out_dir/derived-{n}gpu.jsonl.gz`` (see the module doc) and return its path."""
    base_header, base_polls, pool = _pool()
    statics: list[GpuStatic] = []
    for i in range(n):
        src_name, s, _ = pool[i % len(pool)]
        statics.append(
            s.model_copy(
                update={
                    "index": i,
                    "uuid": f"GPU-{uuid.uuid5(_NAMESPACE, f'{s.uuid}/{i}')}",
                    "serial": f"{s.serial or 'derived'}-{i}",
                    "pci_bus_id": f"00000000:{(i // 32) + 1:02x}:{i % 32:02x}.0",
                    "minor_number": i,
                }
            )
        )
    sources = sorted({name for name, _, _ in pool[: min(n, len(pool))]})
    metadata = {
        "scenario": f"derived-{n}gpu",
        "derived_from": [f"tests/data/traces/{name}" for name in sources],
        "modified": (
            f"{n} GPUs made by bench/traces.py from the {len(pool)} recorded GPUs of {', '.join(sources)}: GPU i is "
            f"recorded GPU i mod {len(pool)} with index i, a new UUID, serial, PCI bus id and minor number, process "
            f"PIDs offset by {_PID_STRIDE} * (i // {len(pool)}), readings re-timed onto the poll times of "
            f"{BASE.name}; every other reading unchanged. Why: benchmark of issue 6; no {n}-GPU node was "
            "available to record."
        ),
    }
    header = base_header.model_copy(
        update={"node": base_header.node.model_copy(update={"gpus": statics}), "metadata": metadata}
    )
    path = out_dir / f"derived-{n}gpu.jsonl.gz"
    with TraceWriter(path, header) as w:
        for j, base in enumerate(base_polls):
            gpus: list[GpuReading] = []
            for i, st in enumerate(statics):
                _, src_static, src_polls = pool[i % len(pool)]
                g, src_ts = _gpu_at(src_polls, j, src_static.index)
                shift = base.timestamp - src_ts
                offset = _PID_STRIDE * (i // len(pool))
                procs = g.processes
                if procs is not None and offset:
                    procs = [p.model_copy(update={"pid": p.pid + offset}) for p in procs]
                gpus.append(
                    g.model_copy(
                        update={
                            "index": i,
                            "uuid": st.uuid,
                            "timestamp": g.timestamp + shift,
                            "utilization_samples": [(t + shift, v) for t, v in g.utilization_samples],
                            "xid_events": [
                                e.model_copy(update={"timestamp": e.timestamp + shift}) for e in g.xid_events
                            ],
                            "processes": procs,
                        }
                    )
                )
            w.write(base.model_copy(update={"gpus": gpus}))
    return path


def trace_for(n: int, out_dir: Path) -> Path:
    """Return the trace of ``n`` replayed GPUs: the real H100 recording for 1, a derived trace otherwise."""
    return ONE_GPU if n == 1 else derive_trace(n, out_dir)

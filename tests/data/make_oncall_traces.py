"""Writes the derived traces of the on-call end-to-end test (tests/test_e2e_prometheus.py), each from a real
recording (tests/data/README.md) with one change its header states in ``metadata.modified``:

- ``derived-h100-memory-95``: the H100 ``compute_bound`` trace with memory used raised to 95% of the total in every
  record: a healthy job whose framework holds most of the memory (the memory alert must not page);
- ``derived-h100-memory-leak``: four passes of the same recording (times and counters run on as a replay loop plays
  them) with memory used at 82% for 60 polls (a job past its warm-up), then rising 0.5% of the total a poll to 100%
  (full at poll 96), then at 0.6% (the job died of it) for the last 10 of 130 polls: a fast leak after a plateau,
  the memory page's minutes as seconds (it must page before the memory is full);
- ``derived-h100-memory-warmup``: the same passes with memory used rising evenly from 30% to 93% over 25 polls, then
  at 93% until the last 10 of 130 polls, at 0.6%: an allocator warming up, then a steady job (it must never page);
- ``derived-h100-memory-two-jobs``: the H100 ``shared-slurm-env`` trace (two processes on one GPU) played for
  TWO_JOBS_POLLS polls as a replay loop plays it, its two processes put in two Slurm jobs (cgroups, users and
  ``SLURM_JOB_ID`` changed) and each one's GPU memory set (the GPU's used memory their sum plus the driver's 0.6%):
  job 4301 (alice, the bf16 process) warms up slowly (5% -> 35%, exponentially, a 10-poll time constant) and then runs
  an evaluation phase every 25 polls (+10% over 4 polls, held 2, released); job 4302 (bob) holds 25% for 60 polls,
  then leaks 0.6% a poll until the GPU is full, holds that 5 polls and exits (its memory 0): a leak in the second
  job of a shared GPU, minutes as seconds (it must page bob before full; alice's warm-up and phases never);
- ``derived-8gpu-lost``: the 8-GPU trace (``derived-8gpu``) where GPU 3 reports XID 79 at the third poll and cannot be
  read from then on (``up`` false, NVML's GPU_IS_LOST): a GPU fallen off the bus. Its processes still run, so each
  down reading carries them as the daemon reads them from /proc for a lost GPU (GPU memory and SM share unknown).

Run: PYTHONPATH=. python3 tests/data/make_oncall_traces.py
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from gpuwarden.model import GpuReading, PollResult, XidEvent
from gpuwarden.replay.source import ReplaySource
from gpuwarden.trace import TraceWriter, read_trace

HERE = Path(__file__).parent
TRACES = HERE / "traces"
COMPUTE = TRACES / "h100-compute_bound.jsonl.gz"
SHARED = TRACES / "h100-shared-slurm-env.jsonl.gz"
TWO_JOBS_POLLS = 300
#: The shared trace's pids -> (Slurm job, user) of the two-jobs trace.
TWO_JOBS = {453: ("4301", "alice"), 454: ("4302", "bob")}
DRIVER_RATIO = 0.006
EIGHT = TRACES / "derived-8gpu.jsonl.gz"
LOST_GPU = 3
LOST_AT = 2


def _derive(
    source: Path,
    out: Path,
    modified: str,
    change: Callable[[int, int, GpuReading], GpuReading],
    verdicts: dict[str, str] | None = None,
) -> None:
    header, polls = read_trace(source)
    meta = {**header.metadata, "derived_from": f"tests/data/traces/{source.name}", "modified": modified}
    if verdicts:
        meta["expected_verdicts"] = {**meta.get("expected_verdicts", {}), **verdicts}
    with TraceWriter(out, header.model_copy(update={"metadata": meta})) as w:
        for n, p in enumerate(polls):
            w.write(PollResult.model_validate({**p.model_dump(), "gpus": [change(n, len(polls), g) for g in p.gpus]}))


def _memory(ratio: Callable[[int, int], float]) -> Callable[[int, int, GpuReading], GpuReading]:
    def change(n: int, total: int, g: GpuReading) -> GpuReading:
        assert g.memory_total_bytes is not None
        used = int(g.memory_total_bytes * ratio(n, total))
        return g.model_copy(update={"memory_used_bytes": used, "memory_free_bytes": g.memory_total_bytes - used})

    return change


def _lost(n: int, total: int, g: GpuReading) -> GpuReading:
    if g.index != LOST_GPU or n < LOST_AT:
        return g
    if n == LOST_AT:
        return g.model_copy(update={"xid_events": [XidEvent(timestamp=g.timestamp, xid=79)]})
    holders = None
    if g.processes is not None:
        holders = [p.model_copy(update={"gpu_memory_bytes": None, "sm_utilization_ratio": None}) for p in g.processes]
    return GpuReading(
        index=g.index, uuid=g.uuid, timestamp=g.timestamp, up=False, error="gpu_is_lost", processes=holders
    )


def _passes(source: Path, out: Path, polls: int, modified: str, ratio: Callable[[int], float]) -> None:
    """``polls`` polls of ``source`` played pass after pass (times and counters continued, as a replay loop plays
    them) with memory used set to ``ratio(n)`` of the total at poll ``n``."""
    src = ReplaySource(source, loop=True, timing="recorded")
    src.open()
    assert src.header is not None
    src._anchor = 0.0  # the recorded times, continued pass after pass
    meta = {**src.header.metadata, "derived_from": f"tests/data/traces/{source.name}", "modified": modified}
    change = _memory(lambda n, total: ratio(n))
    with TraceWriter(out, src.header.model_copy(update={"metadata": meta})) as w:
        for n in range(polls):
            p = src.poll()
            w.write(PollResult.model_validate({**p.model_dump(), "gpus": [change(n, polls, g) for g in p.gpus]}))


def evaluating(n: int) -> float:
    """Job 4301's share of the memory at poll ``n``: a slow warm-up, then an evaluation phase every 25 polls."""
    level = 0.05 + 0.30 * (1 - math.exp(-n / 10))
    if n < 45:
        return level
    k = (n - 45) % 25
    return level + (0.025 * k if k <= 4 else 0.10 if k <= 6 else 0.0)


def leaking(n: int) -> float:
    """Job 4302's share of the memory at poll ``n``: 25% for 60 polls, then 0.6% more a poll until the GPU is full
    (with job 4301's), held 5 polls, then gone."""
    full = two_jobs_full_at()
    if n > full + 5:
        return 0.0
    if n >= full:
        return 1.0 - DRIVER_RATIO - evaluating(n)
    return 0.25 + 0.006 * max(0, n - 60)


def two_jobs_full_at() -> int:
    """The first poll at which the two jobs' memory and the driver's fill the GPU."""
    return next(n for n in range(TWO_JOBS_POLLS) if 0.25 + 0.006 * max(0, n - 60) + evaluating(n) + DRIVER_RATIO >= 1)


def _two_jobs(out: Path) -> None:
    src = ReplaySource(SHARED, loop=True, timing="recorded")
    src.open()
    assert src.header is not None
    src._anchor = 0.0  # the recorded times, continued pass after pass
    meta = {
        **src.header.metadata,
        "derived_from": f"tests/data/traces/{SHARED.name}",
        "modified": f"{TWO_JOBS_POLLS} polls played as a replay loop plays them; pid 453 put in Slurm job 4301 of "
        "alice and pid 454 in job 4302 of bob (cgroup, username, slurm_job_id); each process's GPU memory set: 4301 "
        "a slow warm-up (5% -> 35%, time constant 10 polls) then an evaluation phase every 25 polls (+10% over 4 "
        f"polls, held 2, released), 4302 25% for 60 polls then 0.6% more a poll until the GPU is full (poll "
        f"{two_jobs_full_at()}), held 5 polls, then exited; memory used their sum plus 0.6% (free to match)",
        "expected_memory_page": f"job 4302 (bob) before poll {two_jobs_full_at()}; never job 4301",
    }
    shares = {453: evaluating, 454: leaking}
    with TraceWriter(out, src.header.model_copy(update={"metadata": meta})) as w:
        for n in range(TWO_JOBS_POLLS):
            p = src.poll()
            gpus = []
            for g in p.gpus:
                assert g.memory_total_bytes is not None and g.processes is not None
                total = g.memory_total_bytes
                procs = []
                for proc in g.processes:
                    job, user = TWO_JOBS[proc.pid]
                    share = shares[proc.pid](n)
                    if share <= 0:
                        continue  # exited
                    procs.append(proc.model_copy(update={
                        "gpu_memory_bytes": int(total * share), "username": user, "slurm_job_id": job,
                        "cgroup": f"/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0",
                    }))  # fmt: skip
                used = min(total, int(total * DRIVER_RATIO) + sum(x.gpu_memory_bytes or 0 for x in procs))
                gpus.append(g.model_copy(update={"processes": procs, "memory_used_bytes": used,
                                                 "memory_free_bytes": total - used}))  # fmt: skip
            w.write(PollResult.model_validate({**p.model_dump(), "gpus": gpus}))


def main(out_dir: Path = TRACES) -> None:
    """Write the derived traces into ``out_dir``."""
    _derive(
        COMPUTE,
        out_dir / "derived-h100-memory-95.jsonl.gz",
        "memory_used_bytes set to 95% of memory_total_bytes (free lowered to match) in every record",
        _memory(lambda n, total: 0.95),
    )
    _passes(
        COMPUTE,
        out_dir / "derived-h100-memory-leak.jsonl.gz",
        130,
        "130 polls played as a replay loop plays them; memory_used_bytes at 82% of memory_total_bytes for 60 polls, "
        "then 0.5% more each poll up to 100%, at 0.6% for the last 10 (free to match)",
        lambda n: 0.006 if n >= 120 else min(1.0, 0.82 + 0.005 * max(0, n - 60)),
    )
    _passes(
        COMPUTE,
        out_dir / "derived-h100-memory-warmup.jsonl.gz",
        130,
        "130 polls played as a replay loop plays them; memory_used_bytes rising evenly from 30% to 93% of "
        "memory_total_bytes over 25 polls, then at 93%, at 0.6% for the last 10 (free to match)",
        lambda n: 0.006 if n >= 120 else 0.30 + 0.63 * min(n, 25) / 25,
    )
    _two_jobs(out_dir / "derived-h100-memory-two-jobs.jsonl.gz")
    _derive(
        EIGHT,
        out_dir / "derived-8gpu-lost.jsonl.gz",
        f"GPU {LOST_GPU}: XID 79 at poll {LOST_AT + 1}, then up false with error gpu_is_lost and no readings but "
        "its processes, still running (GPU memory and SM share unknown)",
        _lost,
        verdicts={str(LOST_GPU): "gpu_lost"},
    )


if __name__ == "__main__":
    main()

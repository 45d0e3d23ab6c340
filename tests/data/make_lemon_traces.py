"""Writes the derived traces of the suspect-GPU test (tests/test_e2e_lemon.py): three Slurm jobs in a row on one
2-GPU node, each a pass of the real 2xH200 DDP recording (``h200x2-ddp_straggler``, tests/data/README.md, in which
GPU 1's rank does extra host work and GPU 0 waits on it), with one change each header states in
``metadata.modified``:

- ``derived-h200x2-lemon``: pass k's processes are in the cgroup of Slurm job 7001+k (cgroup v2,
  ``slurmstepd.scope/job_N/step_0/user/task_I``) with their pids moved by 100000 x k. GPU 1 straggles in all three.
- ``derived-h200x2-moving``: the same, and in the second job the two GPUs' utilization, samples, GPM metrics and
  processes trade places, so GPU 0 straggles there: the slowness follows the rank, not a GPU.

Times and counters run on from pass to pass as a replay loop plays them (gpuwarden.replay.source.ReplaySource).

Run: PYTHONPATH=. python3 tests/data/make_lemon_traces.py
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.model import GpuReading, PollResult
from gpuwarden.replay.source import ReplaySource
from gpuwarden.trace import TraceWriter

HERE = Path(__file__).parent
TRACES = HERE / "traces"
SOURCE = TRACES / "h200x2-ddp_straggler.jsonl.gz"
FIRST_JOB = 7001
JOBS = 3
#: What trades places between the GPUs in the moving trace's second job: what the rank does, not the GPU's identity,
#: counters or health.
SWAPPED = ("utilization_gpu_ratio", "utilization_memory_ratio", "utilization_samples", "gpm", "processes")


def _job(g: GpuReading, k: int) -> GpuReading:
    if g.processes is None:
        return g
    job = FIRST_JOB + k
    procs = [
        p.model_copy(update={"pid": p.pid + 100000 * k,
                             "cgroup": f"/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_{i}"})
        for i, p in enumerate(g.processes)
    ]  # fmt: skip
    return g.model_copy(update={"processes": procs})


def _swapped(gpus: list[GpuReading]) -> list[GpuReading]:
    a, b = gpus
    return [a.model_copy(update={f: getattr(b, f) for f in SWAPPED}),
            b.model_copy(update={f: getattr(a, f) for f in SWAPPED})]  # fmt: skip


def write(name: str, moving: bool) -> Path:
    """Write ``derived-h200x2-<name>`` and return its path."""
    src = ReplaySource(SOURCE, loop=True, timing="recorded")
    src.open()
    assert src.header is not None
    src._anchor = 0.0  # the recorded times, continued pass after pass
    header = src.header
    out = TRACES / f"derived-h200x2-{name}.jsonl.gz"
    change = f"three passes as Slurm jobs {FIRST_JOB}-{FIRST_JOB + JOBS - 1} (cgroups, pids + 100000 x pass)"
    if moving:
        change += f"; in job {FIRST_JOB + 1} GPUs 0 and 1 trade {', '.join(SWAPPED)}"
    meta = {**header.metadata, "derived_from": f"tests/data/traces/{SOURCE.name}", "modified": change,
            "expected_suspects": [] if moving else ["1"]}  # fmt: skip
    with TraceWriter(out, header.model_copy(update={"metadata": meta})) as w:
        for k in range(JOBS):
            for _ in range(src.polls_in_trace):
                p = src.poll()
                gpus = [_job(g, k) for g in p.gpus]
                if moving and k == 1:
                    gpus = _swapped(gpus)
                w.write(PollResult.model_validate({**p.model_dump(), "gpus": [g.model_dump() for g in gpus]}))
    return out


if __name__ == "__main__":
    print(write("lemon", moving=False))
    print(write("moving", moving=True))

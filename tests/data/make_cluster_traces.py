"""Writes the derived traces of the cluster test (tests/test_cluster_cli.py), each from the real 2xH200 DDP recording
(``h200x2-ddp_straggler``, tests/data/README.md) with one change its header states in ``metadata.modified``:

- ``derived-h200x2-slurm-4242-a`` and ``derived-h200x2-slurm-4242-b``: every GPU process moved into the cgroup of
  Slurm job 4242 as Slurm 26.05 names it by default, by the job's SLUID (cgroup v2,
  ``slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_N``), as two nodes running one 4-rank job would show it. On node
  a the processes' environment gives SLURM_JOB_ID=4242 (a daemon allowed to read it); on node b it is unreadable (the
  shipped unit's case). Node b's GPUs get other UUIDs (their first hex digit changed), as another node's GPUs have.

Run: PYTHONPATH=. python3 tests/data/make_cluster_traces.py
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.model import GpuReading, PollResult
from gpuwarden.trace import TraceWriter, read_trace

HERE = Path(__file__).parent
TRACES = HERE / "traces"
SOURCE = TRACES / "h200x2-ddp_straggler.jsonl.gz"
JOB = 4242
SLUID = "sEKNKTV3WPV500"


def _uuid(uuid: str, node: str) -> str:
    return uuid if node == "a" else "GPU-b" + uuid[5:]


def _gpu(g: GpuReading, node: str) -> GpuReading:
    procs = None
    if g.processes is not None:
        procs = [
            p.model_copy(
                update={
                    "cgroup": f"/system.slice/slurmstepd.scope/{SLUID}/step_0/user/task_{i}",
                    "slurm_job_id": str(JOB) if node == "a" else None,
                }
            )
            for i, p in enumerate(g.processes)
        ]
    return g.model_copy(update={"uuid": _uuid(g.uuid, node), "processes": procs})


def write(node: str) -> Path:
    """Write the trace of node ``node`` ("a" or "b") and return its path."""
    header, polls = read_trace(SOURCE)
    out = TRACES / f"derived-h200x2-slurm-{JOB}-{node}.jsonl.gz"
    meta = {
        **header.metadata,
        "derived_from": f"tests/data/traces/{SOURCE.name}",
        "modified": f"every GPU process in the cgroup of Slurm job {JOB} named by its SLUID {SLUID}; node {node}"
        + (f", SLURM_JOB_ID={JOB} in the environment" if node == "a" else ", GPU UUIDs changed (first hex digit b)"),
    }
    node_static = header.node.model_copy(
        update={"gpus": [s.model_copy(update={"uuid": _uuid(s.uuid, node)}) for s in header.node.gpus]}
    )
    with TraceWriter(out, header.model_copy(update={"metadata": meta, "node": node_static})) as w:
        for p in polls:
            w.write(PollResult.model_validate({**p.model_dump(), "gpus": [_gpu(g, node) for g in p.gpus]}))
    return out


if __name__ == "__main__":
    for n in ("a", "b"):
        print(write(n))

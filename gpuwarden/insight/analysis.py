"""The analysis of one poll: from the captured windows of every GPU to the InsightResult - each GPU's verdict (with
its job's other GPUs as peers), the jobs and their imbalance and shortfalls, the node's imbalance."""

from __future__ import annotations

from gpuwarden.insight.attribution import JobRef
from gpuwarden.insight.diagnosis import GpuWindow, diagnose, lost
from gpuwarden.insight.result import GpuInsight, InsightResult, JobInsight, ProcessJob
from gpuwarden.insight.scores import imbalance, shortfalls, starved_ratio
from gpuwarden.insight.windows import GpuCapture

#: At most this many jobs are reported (the ones holding most GPU memory): bounds ``gpu_job_*`` series.
MAX_JOBS = 64


def activities(windows: list[GpuWindow]) -> tuple[list[float], str] | None:
    """Per-GPU activity: SM activity when every GPU has it, else util.gpu when every GPU has it."""
    if windows and all(w.sm is not None for w in windows):
        return [w.sm for w in windows], "sm_activity"  # type: ignore[misc]
    if windows and all(w.util is not None for w in windows):
        return [w.util for w in windows], "utilization_gpu"  # type: ignore[misc]
    return None


def build_result(
    timestamp: float,
    window_seconds: float,
    diagnosis_seconds: float,
    captures: list[GpuCapture],
    up: list[str],
    processes: list[ProcessJob],
    primary: dict[str, JobRef],
    down: dict[str, str] | None = None,
) -> InsightResult:
    """The InsightResult of one poll from what the analyzer captured after it (``up``: UUIDs of the GPUs up, in the
    poll's order; ``primary``: each GPU's job, the one holding most of its memory; ``down``: the GPUs that could not
    be read this poll, with NVML's error)."""
    diag_w: dict[str, GpuWindow] = {}
    job_w: dict[str, GpuWindow] = {}
    node_w: dict[str, GpuWindow] = {}
    index = {c.uuid: c.index for c in captures}
    for c in captures:
        job = primary.get(c.uuid)
        node_w[c.uuid] = c.node.window(c.index, c.uuid, job)
        if c.diag is not None and c.job is not None:
            diag_w[c.uuid] = c.diag.window(c.index, c.uuid, job)
            job_w[c.uuid] = c.job.window(c.index, c.uuid, job)
    # jobs: the GPUs where each job holds the most memory
    by_job: dict[tuple[str, str], list[str]] = {}
    for uuid, ref in primary.items():
        by_job.setdefault((ref.kind, ref.job), []).append(uuid)
    mem: dict[tuple[str, str], int] = {}
    pids: dict[tuple[str, str], set[int]] = {}
    for p in processes:
        key = (p.job_kind, p.job)
        mem[key] = mem.get(key, 0) + (p.gpu_memory_bytes or 0)
        pids.setdefault(key, set()).add(p.pid)
    jobs: list[JobInsight] = []
    shortfall: dict[str, float] = {}
    for key in sorted(mem, key=lambda k: (-mem[k], k))[:MAX_JOBS]:
        uuids = sorted(by_job.get(key, []), key=lambda u: index[u])
        act = activities([job_w[u] for u in uuids if u in job_w])
        falls = shortfalls(act[0]) if act else None
        if falls is not None:
            shortfall.update(zip([u for u in uuids if u in job_w], falls, strict=True))
        jobs.append(
            JobInsight(
                job=key[1],
                job_kind=key[0],
                gpus=[index[u] for u in uuids],
                pids=sorted(pids[key]),
                imbalance_ratio=imbalance(act[0]) if act else None,
                activity_source=act[1] if act else None,
            )
        )
    gpus: list[GpuInsight] = []
    for c in captures:  # in GPU index order
        uuid = c.uuid
        w = node_w[uuid]
        diagnosis = None
        if uuid in diag_w:
            job = primary.get(uuid)
            peers = [
                diag_w[u] for u, ref in primary.items() if u != uuid and job is not None and ref == job and u in diag_w
            ]
            diagnosis = diagnose(diag_w[uuid], peers)
        elif down and uuid in down:
            diagnosis = lost(c.index, uuid, down[uuid])
        activity = w.sm if w.sm is not None else w.util
        source = "sm_activity" if w.sm is not None else "utilization_gpu"
        gpus.append(
            GpuInsight(
                gpu=c.index,
                uuid=uuid,
                state_seconds_total=c.totals,
                idle_seconds_total=c.idle,
                held_idle_energy_joules_total=c.held_idle_joules,
                window_state_seconds=dict(w.states),
                starved_ratio=starved_ratio(w.states),
                activity_ratio=activity,
                activity_source=None if activity is None else source,
                shortfall_ratio=shortfall.get(uuid),
                diagnosis=diagnosis,
                state_runs=list(c.runs),
            )
        )
    node_act = activities([node_w[u] for u in up if u in node_w])
    return InsightResult(
        timestamp=timestamp,
        window_seconds=window_seconds,
        diagnosis_window_seconds=diagnosis_seconds,
        gpus=gpus,
        processes=processes,
        jobs=jobs,
        node_imbalance_ratio=imbalance(node_act[0]) if node_act else None,
        node_activity_source=node_act[1] if node_act and len(node_act[0]) >= 2 else None,
    )

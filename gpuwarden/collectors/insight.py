"""Time accounting, starved and imbalance scores, job attribution and diagnosis (``gpuwarden.insight``).

Reads ``snapshot.analyses["insight"]`` (an ``InsightResult``); definitions in docs/scores.md.

- ``gpu_state_seconds_total{gpu,uuid,state}`` counter: seconds the GPU spent in each state since the daemon
  started; ``state`` is one of busy, starved, held_idle, free, unknown (they add up to the accounted wall time).
- ``gpu_starved_ratio{gpu,uuid}``: starved seconds / accounted seconds over the analyzer window (default 5 min).
- ``gpu_node_imbalance_ratio``: load imbalance over all GPUs of the node in [0, 1] (0 balanced, 1 one GPU does
  all the work), on GPM SM activity where every GPU has it, else util.gpu. Absent with fewer than 2 GPUs.
- ``gpu_job_imbalance_ratio{job_id,job_kind}``: the same over the GPUs where one job holds the most memory; only
  jobs on 2+ GPUs, at most 64 jobs.
- ``gpu_diagnosis{gpu,uuid,reason}``: 1 for the verdict and for each extra finding (throttled,
  memory_nearly_full), 0 for every other reason of the fixed set (``gpuwarden.insight.diagnosis.REASONS``);
  absent until the analyzer has 2 s of history for the GPU.
- ``gpu_process_job_info{gpu,uuid,pid,job_id,job_kind,container_id,user,command}`` = 1: the job of each GPU process
  (the ``max_processes_per_gpu`` largest by GPU memory per GPU); series end with their process. Join on
  ``gpu``/``uuid`` to put job labels on per-GPU series without making them part of those series.
"""

from __future__ import annotations

from prometheus_client.core import InfoMetricFamily, Metric

from gpuwarden.catalog import Family
from gpuwarden.collectors.registry import CollectOptions, builds, new_family
from gpuwarden.insight.analyzer import InsightResult, insight_result
from gpuwarden.insight.diagnosis import REASONS
from gpuwarden.insight.states import IDLE_CAUSES, STATES
from gpuwarden.snapshot import NodeSnapshot


def _result(snap: NodeSnapshot) -> InsightResult | None:
    if snap.poll is None:
        return None
    return insight_result(snap.analyses.get("insight"))


@builds("gpu_state_seconds_total")
def state_seconds(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> Metric | None:
    """Return the seconds each GPU spent in each state (every state, 0 included)."""
    res = _result(snap)
    if res is None:
        return None
    states = new_family(fam)
    for g in res.gpus:
        for s in STATES:
            states.add_metric([str(g.gpu), g.uuid, s], g.state_seconds_total.get(s, 0.0))  # type: ignore[attr-defined]
    return states if states.samples else None


@builds("gpu_idle_seconds_total")
def idle_seconds(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> Metric | None:
    """Return the seconds each GPU idled by cause (every cause, 0 included)."""
    res = _result(snap)
    if res is None:
        return None
    idle = new_family(fam)
    for g in res.gpus:
        for cause in IDLE_CAUSES:
            idle.add_metric([str(g.gpu), g.uuid, cause], g.idle_seconds_total.get(cause, 0.0))  # type: ignore[attr-defined]
    return idle if idle.samples else None


@builds("gpu_starved_ratio")
def starved_ratio(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> Metric | None:
    """Return each GPU's starved share of the analyzer window (help text names the window)."""
    res = _result(snap)
    if res is None:
        return None
    starved = new_family(fam, fam.help.format(window=f"{res.window_seconds:g}"))
    for g in res.gpus:
        if g.starved_ratio is not None:
            starved.add_metric([str(g.gpu), g.uuid], g.starved_ratio)  # type: ignore[attr-defined]
    return starved if starved.samples else None


@builds("gpu_diagnosis")
def diagnosis(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> Metric | None:
    """Return 1 for each GPU's verdict and findings and 0 for every other reason of the fixed set."""
    res = _result(snap)
    if res is None:
        return None
    metric = new_family(fam)
    for g in res.gpus:
        if g.diagnosis is not None:
            found = set(g.diagnosis.findings)
            for r in REASONS:
                metric.add_metric([str(g.gpu), g.uuid, r], 1.0 if r in found else 0.0)  # type: ignore[attr-defined]
    return metric if metric.samples else None


@builds("gpu_job_shortfall_ratio")
def job_shortfall(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> Metric | None:
    """Return each GPU's shortfall against the busiest GPU of its job (GPUs of jobs on 2+ GPUs)."""
    res = _result(snap)
    if res is None:
        return None
    metric = new_family(fam)
    for g in res.gpus:
        if g.shortfall_ratio is not None:
            metric.add_metric([str(g.gpu), g.uuid], g.shortfall_ratio)  # type: ignore[attr-defined]
    return metric if metric.samples else None


@builds("gpu_node_imbalance_ratio")
def node_imbalance(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> Metric | None:
    """Return the node's imbalance (absent with fewer than 2 GPUs)."""
    res = _result(snap)
    if res is None or res.node_imbalance_ratio is None:
        return None
    node = new_family(fam)
    node.add_metric([], res.node_imbalance_ratio)  # type: ignore[attr-defined]
    return node


@builds("gpu_job_imbalance_ratio")
def job_imbalance(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> Metric | None:
    """Return the imbalance of each job on 2 or more GPUs."""
    res = _result(snap)
    if res is None:
        return None
    job = new_family(fam)
    for j in res.jobs:
        if j.imbalance_ratio is not None:
            job.add_metric([j.job, j.job_kind], j.imbalance_ratio)  # type: ignore[attr-defined]
    return job if job.samples else None


@builds("gpu_process_job_info")
def process_job(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> Metric | None:
    """Return the job of each GPU process (the ``max_processes_per_gpu`` largest by GPU memory per GPU)."""
    res = _result(snap)
    if res is None:
        return None
    info = new_family(fam)
    assert isinstance(info, InfoMetricFamily)
    per_gpu: dict[str, int] = {}
    for p in sorted(res.processes, key=lambda p: (p.gpu, -(p.gpu_memory_bytes or 0), p.pid)):
        n = per_gpu.get(p.uuid, 0)
        if n >= opts.max_processes_per_gpu:
            continue
        per_gpu[p.uuid] = n + 1
        info.add_metric(
            [str(p.gpu), p.uuid],
            {
                "pid": str(p.pid),
                "job_id": p.job,
                "job_kind": p.job_kind,
                "container_id": p.container_id,
                "user": p.user,
                "command": p.command,
            },
        )
    return info if info.samples else None

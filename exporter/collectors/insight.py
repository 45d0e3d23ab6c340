"""Time accounting, starved and imbalance scores, job attribution and diagnosis (``exporter.insight``).

Reads ``snapshot.analyses["insight"]`` (an ``InsightResult``); definitions in docs/scores.md.

- ``gpu_state_seconds_total{gpu,uuid,state}`` counter: seconds the GPU spent in each state since the daemon
  started; ``state`` is one of busy, starved, held_idle, free, unknown (they add up to the accounted wall time).
- ``gpu_starved_ratio{gpu,uuid}``: starved seconds / accounted seconds over the analyzer window (default 5 min).
- ``gpu_node_imbalance_ratio``: load imbalance over all GPUs of the node in [0, 1] (0 balanced, 1 one GPU does
  all the work), on GPM SM activity where every GPU has it, else util.gpu. Absent with fewer than 2 GPUs.
- ``gpu_job_imbalance_ratio{job_id,job_kind}``: the same over the GPUs where one job holds the most memory; only
  jobs on 2+ GPUs, at most 64 jobs.
- ``gpu_diagnosis{gpu,uuid,reason}``: 1 for the verdict and for each extra finding (throttled,
  memory_nearly_full), 0 for every other reason of the fixed set (``exporter.insight.diagnosis.REASONS``);
  absent until the analyzer has 2 s of history for the GPU.
- ``gpu_process_job_info{gpu,uuid,pid,job_id,job_kind,container_id,user,command}`` = 1: the job of each GPU process
  (the ``max_processes_per_gpu`` largest by GPU memory per GPU); series end with their process. Join on
  ``gpu``/``uuid`` to put job labels on per-GPU series without making them part of those series.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric

from exporter.collectors.base import GPU_LABELS, CollectOptions, collector, counter, gauge
from exporter.insight.analyzer import InsightResult, insight_result
from exporter.insight.diagnosis import REASONS
from exporter.insight.states import STATES
from exporter.poller import NodeSnapshot


def _result(snap: NodeSnapshot) -> InsightResult | None:
    if snap.poll is None:
        return None
    return insight_result(snap.analyses.get("insight"))


@collector("insight", help="GPU state seconds, starved ratio, imbalance, job attribution and diagnosis")
def collect(snap: NodeSnapshot, opts: CollectOptions) -> Iterable[Metric]:
    """Yield the insight families listed in the module docstring (none before the first analysis)."""
    res = _result(snap)
    if res is None:
        return
    states = counter("gpu_state_seconds", "Seconds the GPU spent in each state (see docs/scores.md).", ["state"])
    starved = gauge(
        "gpu_starved_ratio",
        f"Share of the last {res.window_seconds:g} s in which the GPU sat idle while the job holding it worked.",
    )
    diagnosis = gauge(
        "gpu_diagnosis", "1 when the reason is the GPU's verdict or an extra finding, else 0.", ["reason"]
    )
    for g in res.gpus:
        labels = [str(g.gpu), g.uuid]
        for s in STATES:
            states.add_metric([*labels, s], g.state_seconds_total.get(s, 0.0))
        if g.starved_ratio is not None:
            starved.add_metric(labels, g.starved_ratio)
        if g.diagnosis is not None:
            found = set(g.diagnosis.findings)
            for r in REASONS:
                diagnosis.add_metric([*labels, r], 1.0 if r in found else 0.0)
    for fam in (states, starved, diagnosis):
        if fam.samples:
            yield fam
    if res.node_imbalance_ratio is not None:
        node = GaugeMetricFamily(
            "gpu_node_imbalance_ratio",
            "Load imbalance over the node's GPUs: 0 balanced, 1 one GPU does all the work (docs/scores.md).",
        )
        node.add_metric([], res.node_imbalance_ratio)
        yield node
    job = GaugeMetricFamily(
        "gpu_job_imbalance_ratio",
        "Load imbalance over the GPUs of one job: 0 balanced, 1 one GPU does all the work (docs/scores.md).",
        labels=["job_id", "job_kind"],
    )
    for j in res.jobs:
        if j.imbalance_ratio is not None:
            job.add_metric([j.job, j.job_kind], j.imbalance_ratio)
    if job.samples:
        yield job
    info = InfoMetricFamily(
        "gpu_process_job",
        "The job of a GPU process: Kubernetes pod UID, Slurm job, container, systemd unit, cgroup or user/command.",
        labels=GPU_LABELS,
    )
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
    if info.samples:
        yield info

"""Fail-slow suspects: GPUs that were the sustained straggler of several distinct jobs over a range, with the
node-local evidence Prometheus holds for each, from gpuwarden's series (no recording rule needed; the shipped rules
``job_id:gpu_straggler:sustained`` and ``uuid:gpu_straggler_jobs:count`` and the alert GpuSuspectFailSlow compute the
same).

- **Straggler of a job**: the daemon flagged the GPU ``straggler`` (``gpu_diagnosis{reason="straggler"}``: the other
  GPUs of its job wait on it in collectives, docs/scores.md) at every sample of ``straggler_for``, and the job held it
  then and ``straggler_for`` before (a flag left from the previous job never counts for the next). One slow job
  proves little (a rank with more host work or a larger shard straggles too); the same GPU holding back job after job
  points at the GPU (Greyhound, ATC'25; Guard, MLSys'26). Where the straggling moves between GPUs from job to job, no
  GPU reaches the count.
- **Evidence** (``evidence``): what the node's own series say of the suspect against the node's other GPUs over the
  same range. An empty list means none on the node: the cause is outside what NVML sees.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from statistics import mean
from typing import TYPE_CHECKING

from gpuwarden.catalog import THROTTLE_REASONS

if TYPE_CHECKING:
    from gpuwarden.cluster.accounting_queries import Cluster, GpuKey
    from gpuwarden.cluster.usage import Accounting

#: A suspect's mean SM clock below this share of its node's other GPUs' is evidence (at the power they draw).
CLOCK_BELOW_PEERS = 0.97
#: Seconds in a power, thermal or hardware clock event beyond the node's other GPUs' mean that are evidence.
CLOCK_EVENT_SECONDS = 60.0
#: A memory (HBM) temperature peak this many degrees above the hottest of the node's other GPUs is evidence.
MEMORY_HOTTER_CELSIUS = 5.0


@dataclass
class Suspect:
    """A GPU (instance, gpu index, uuid, in its cluster) that was the sustained straggler of ``jobs`` distinct jobs
    in the range, with the node-local ``evidence`` (one sentence each; empty: none on the node)."""

    instance: str
    gpu: str
    uuid: str
    jobs: int
    evidence: list[str] = field(default_factory=list)
    cluster: Cluster = ()


def suspects(acc: Accounting, straggler_for: str = "5m", min_jobs: int = 3) -> list[Suspect]:
    """The GPUs that were the sustained straggler (flagged for all of ``straggler_for``, a Prometheus duration) of at
    least ``min_jobs`` distinct jobs over ``acc``'s range, most jobs first, each with its evidence. Raises
    PrometheusError when Prometheus cannot answer."""
    flag = acc.metric("gpu_diagnosis", 'reason="straggler"')
    info, up = acc.metric("gpu_process_job_info"), acc.metric("gpu_up")
    c = acc.cluster_by
    held = f"max by ({c}instance, gpu, uuid, job_id) ({info})"
    held_before = f"max by ({c}instance, gpu, uuid, job_id) ({info} offset {straggler_for})"
    # flagged at every scrape of the window: the flag has a series only while it holds (gpu_diagnosis)
    every = f"count_over_time({flag}[{straggler_for}]) >= ignoring (reason) count_over_time({up}[{straggler_for}])"
    sustained = f"((0 * ({every}) + 1) * on ({c}instance, gpu, uuid) group_right () ({held} and {held_before}))"
    q = (f"count by ({c}instance, gpu, uuid) (count_over_time({sustained}[{acc.range}:{acc.step}]))"
         f" >= {int(min_jobs)}")  # fmt: skip
    found = [Suspect(s.labels["instance"], s.labels["gpu"], s.labels.get("uuid", ""), int(s.value),
                     cluster=acc.cluster_of(s.labels)) for s in acc.samples(q, "instance", "gpu")]  # fmt: skip
    if found:
        _add_evidence(acc, found)
    return sorted(found, key=lambda s: (-s.jobs, s.cluster, s.instance, s.gpu))


def _per_gpu(acc: Accounting, promql: str, by: str = "") -> dict[GpuKey, dict[str, float]]:
    """(cluster, instance, gpu) -> {label value of ``by`` (or ""): value} of a query summed by the cluster labels,
    instance, gpu[, by]."""
    out: dict[GpuKey, dict[str, float]] = defaultdict(dict)
    labels = f"{acc.cluster_by}instance, gpu" + (f", {by}" if by else "")
    for s in acc.samples(f"sum by ({labels}) ({promql})", "instance", "gpu"):
        out[acc.gpu_key(s.labels)][s.labels.get(by, "") if by else ""] = s.value
    return out


def _peers(values: dict[GpuKey, dict[str, float]], g: GpuKey, key: str = "") -> list[float]:
    """The values of the other GPUs of ``g``'s node (same cluster and instance)."""
    return [v[key] for (cl, inst, gpu), v in values.items() if (cl, inst) == g[:2] and gpu != g[2] and key in v]


def _add_evidence(acc: Accounting, found: list[Suspect]) -> None:
    """Fill each suspect's evidence from its node's series over the range (one query per signal, every GPU)."""
    r = acc.range
    sm_clock = acc.metric("gpu_clock_hertz", 'clock="sm"')
    clock = _per_gpu(acc, f"avg_over_time({sm_clock}[{r}])")
    power = _per_gpu(acc, f"avg_over_time({acc.metric('gpu_power_usage_watts')}[{r}])")
    throttles = acc.metric("gpu_clock_event_reason_seconds_total", 'reason=~"' + "|".join(THROTTLE_REASONS) + '"')
    events = _per_gpu(acc, f"increase({throttles}[{r}])", by="reason")
    replays = _per_gpu(acc, f"increase({acc.metric('gpu_pcie_replay_errors_total')}[{r}])")
    nvlink = _per_gpu(acc, f"increase({acc.metric('gpu_nvlink_errors_total')}[{r}])")
    pending = _per_gpu(acc, f"max_over_time({acc.metric('gpu_row_remap_pending')}[{r}])")
    hbm = _per_gpu(acc, f"max_over_time({acc.metric('gpu_memory_temperature_celsius')}[{r}])")
    for s in found:
        g, ev = (s.cluster, s.instance, s.gpu), s.evidence
        peers = _peers(clock, g)
        if g in clock and peers and clock[g][""] < CLOCK_BELOW_PEERS * mean(peers):
            watts = _peers(power, g)
            at = f" at {power[g][''] / mean(watts):.0%} of their power" if g in power and watts and mean(watts) else ""
            ev.append(f"SM clock {clock[g][''] / mean(peers):.0%} of the node's other GPUs'{at}")
        for reason, secs in sorted(events.get(g, {}).items()):
            others = _peers(events, g, reason)
            if secs - (mean(others) if others else 0.0) >= CLOCK_EVENT_SECONDS:
                ev.append(f"{secs:.0f} s of clock event {reason} (the node's other GPUs: {mean(others or [0]):.0f} s)")
        if replays.get(g, {}).get("", 0) >= 1:
            ev.append(f"{replays[g]['']:.0f} PCIe replays")
        if nvlink.get(g, {}).get("", 0) >= 1:
            ev.append(f"{nvlink[g]['']:.0f} NVLink CRC errors")
        if pending.get(g, {}).get("", 0) >= 1:
            ev.append("row remapping pending (a reset applies it)")
        hot = _peers(hbm, g)
        if g in hbm and hot and hbm[g][""] >= max(hot) + MEMORY_HOTTER_CELSIUS:
            ev.append(f"memory temperature peaked at {hbm[g]['']:.0f} °C, the node's other GPUs at {max(hot):.0f} °C")

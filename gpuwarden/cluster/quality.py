"""Node quality across jobs: each GPU's health and speed over a range (days, across the jobs it ran), joined into a
tier, a score and the reasons, from gpuwarden's series in Prometheus (one query per signal, every GPU at once).

Two tiers of reasons, each grounded in what its signal means:

- the health rules (gpuwarden.health.rules, the conditions the health alerts fire on and ``gpuwarden check`` reads)
  that are faults of the GPU itself: a rule whose condition held, in total over the range, at least its alert's
  ``for`` (at least one step; counted at the accounting's steps) is a reason of its tier, **service** for a critical
  rule (lost, a recovery action asked, uncorrectable ECC errors, a failed row remap, heat at the card's own limits,
  the NVLink fabric not ready), **watch** for a warning one (a row remap pending, a narrowed PCIe link, a fabric
  health problem);
- the history no one read shows: **service** for an XID of the critical set (``xid_critical``, the alerts'
  GpuCriticalXid: double-bit ECC, row remap failure, NVLink, uncorrectable contained or uncontained errors, GSP
  faults) and an NVLink link that went down after being up; **watch** for the sustained straggler of at least
  ``min_jobs`` distinct jobs (the fail-slow suspects, gpuwarden.cluster.suspects), NVLink link recoveries, PCIe replays
  (at least REPLAYS over the range), hardware slowdown or power brake clock events at least CLOCK_EVENT_SECONDS beyond
  the node's other GPUs' mean, and an XID outside the critical set;
- the GPU set against the other GPUs of its jobs (**watch**, each where it held at least OUTLIER_SECONDS in total over
  the range, at the accounting's steps, in Slurm or Kubernetes jobs of at least ``xid_application_outlier_gpus``
  GPUs: the alerts' GpuThrottledAloneInJob and GpuHotterThanItsJob, from the raw series, no recording rule needed):
  its clocks held down for its own condition (a thermal or hardware clock event reason, not the power cap, active
  at least half of 5 minutes) while at most one of its
  job's GPUs, or fewer than ``outlier_ratio`` of them, were; and ``outlier_temperature_celsius`` above the median of
  its job's GPUs. A job's GPUs run the same code, so a GPU apart from them is the GPU's (docs/runbook.md says what
  it cannot tell).

``score`` orders GPUs, it is not a probability: 1 / (1 + 3 x service reasons + watch reasons) - 1.0 for a GPU with
no reason, 0.5 with one watch reason, 0.25 with one service reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import mean
from typing import TYPE_CHECKING

from gpuwarden.catalog import CONDITION_REASONS
from gpuwarden.cluster.suspects import CLOCK_EVENT_SECONDS, suspects
from gpuwarden.health.conditions import number, shipped
from gpuwarden.health.rules import RULES, HealthRule
from gpuwarden.insight.vocabulary.thresholds import ALERT_PARAMS
from gpuwarden.mixin.rules import ParamTemplate, duration, seconds

if TYPE_CHECKING:
    from gpuwarden.cluster.accounting_queries import Cluster, GpuKey
    from gpuwarden.cluster.usage import Accounting

#: XIDs that take a GPU out of service (the alert rules' xid_critical, gpuwarden/mixin/params.yml).
XID_CRITICAL = re.compile(r"^(48|62|64|74|79|95|119|120|140)$")
#: PCIe replays over the range that make a GPU worth watching (a marginal link: signal integrity, a riser).
REPLAYS = 100
#: Hardware clock events (not power capping, which is the workload's) compared with the node's other GPUs.
HW_EVENTS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
TIERS = ("service", "watch", "good")
#: Seconds a GPU must have been apart from its job's GPUs over the range to be a reason (the alerts' ``for``, 10m).
OUTLIER_SECONDS = 600.0


@dataclass
class GpuQuality:
    """One GPU (instance, gpu index, uuid, in its cluster): its tier (service, watch, good), score and reasons, each
    (tier, one sentence)."""

    instance: str
    gpu: str
    uuid: str = ""
    cluster: Cluster = ()
    reasons: list[tuple[str, str]] = field(default_factory=list)

    @property
    def tier(self) -> str:
        """The worst tier among the reasons (good without any)."""
        return min((t for t, _ in self.reasons), key=TIERS.index, default="good")

    @property
    def score(self) -> float:
        """1 / (1 + 3 x service reasons + watch reasons): an ordering, not a probability."""
        service = sum(1 for t, _ in self.reasons if t == "service")
        return 1.0 / (1 + 3 * service + (len(self.reasons) - service))


def quality(acc: Accounting, straggler_for: str = "5m", min_jobs: int = 3) -> list[GpuQuality]:
    """Every GPU seen over ``acc``'s range with its reasons, worst first (lowest score, then by node and GPU); GPUs
    without a reason are included (tier good). Raises PrometheusError when Prometheus cannot answer."""
    r, c = acc.range, acc.cluster_by
    gpus: dict[GpuKey, GpuQuality] = {}

    def gpu(labels: dict[str, str]) -> GpuQuality:
        key = acc.gpu_key(labels)
        q = gpus.setdefault(key, GpuQuality(key[1], key[2], cluster=key[0]))
        q.uuid = q.uuid or labels.get("uuid", "")
        return q

    def each(promql: str, *need: str) -> list[tuple[GpuQuality, dict[str, str], float]]:
        return [(gpu(s.labels), s.labels, s.value) for s in acc.samples(promql, "instance", "gpu", *need)]

    each(f"max by ({c}instance, gpu, uuid) (max_over_time({acc.metric('gpu_up')}[{r}]))")  # every GPU of the range
    for rule in RULES:
        if rule.quality:
            _held(acc, each, rule)
    xids = acc.metric("gpu_xid_errors_total")
    for q, labels, n in each(f"sum by ({c}instance, gpu, uuid, xid) ({grown(xids, r)})", "xid"):
        if n >= 1:
            tier = "service" if XID_CRITICAL.match(labels["xid"]) else "watch"
            q.reasons.append((tier, f"XID {labels['xid']} ({n:.0f}x)"))
    _nvlink(acc, each)
    _pcie_and_clocks(acc, each, gpus)
    _job_outliers(acc, each)
    for s in suspects(acc, straggler_for, min_jobs):
        q = gpus.setdefault((s.cluster, s.instance, s.gpu), GpuQuality(s.instance, s.gpu, s.uuid, s.cluster))
        q.reasons.append(("watch", f"the sustained straggler of {s.jobs} jobs (fail-slow)"))
    return sorted(gpus.values(), key=lambda q: (q.score, q.cluster, q.instance, _index(q.gpu)))


def grown(selector: str, range_: str) -> str:
    """PromQL for the growth of the counters ``selector`` selects over ``range_``, per series: ``increase()``, plus the
    first value of a counter that appeared within the range (gpuwarden exports an XID code, a link's error counter or
    a clock event reason's seconds only once it counted something, and ``increase()`` of a counter that appears at 1
    and stays there is 0)."""
    appeared = f"(min_over_time({selector}[{range_}]) unless {selector} offset {range_})"
    return f"increase({selector}[{range_}]) + {appeared} or increase({selector}[{range_}]) or {appeared}"


def _index(gpu: str) -> int:
    return int(gpu) if gpu.isdigit() else -1


#: A query's samples as (the GPU's quality entry, the sample's labels, its value).
Each = Callable[..., list[tuple["GpuQuality", dict[str, str], float]]]


def _held(acc: Accounting, each: Each, rule: HealthRule) -> None:
    """A health rule's reason for each GPU where its condition held, in total over the range, at least the alert's
    ``for`` (at least one step): counted at the accounting's steps (a subquery of the condition, its parameters at
    their shipped values). The reason is the alert's summary, the labels of the series that held where the condition
    does not fix them (a fabric state, a health check), and how long it held."""
    cond = rule.when.promql(acc.metric, lambda p: number(shipped(p)))
    least = max(seconds(rule.for_) if rule.for_ else 0.0, acc.step_s)
    fixed = {label for s in rule.when.series_read() for label, op, _ in s.matchers if op == "="}
    shown = [*acc.cluster_labels, "instance", "job", "gpu", "uuid", *fixed]
    summary = ParamTemplate(rule.summary.rstrip(".")).safe_substitute({k: str(v) for k, v in ALERT_PARAMS.items()})
    for q, labels, held in each(f"count_over_time(({cond})[{acc.range}:{acc.step}]) * {acc.step_s:g}"):
        if held >= least:
            what = "".join(f"{k} {v}, " for k, v in sorted(labels.items()) if k not in shown)
            q.reasons.append((rule.tier, f"{summary}: {what}{duration(held)} of the range"))


def _nvlink(acc: Accounting, each: Each) -> None:
    """NVLink: links that went down after being up, and link recoveries."""
    r, c = acc.range, acc.cluster_by
    up = acc.metric("gpu_nvlink_link_up")
    for q, _, links in each(f"count by ({c}instance, gpu, uuid) ((min_over_time({up}[{r}]) == 0)"
                            f" and (max_over_time({up}[{r}]) == 1))"):  # fmt: skip
        q.reasons.append(("service", f"{links:.0f} NVLink link(s) went down"))
    recoveries = acc.metric("gpu_nvlink_link_errors_total", 'type=~"recovery|recovery_successful|recovery_failed"')
    for q, _, n in each(f"sum by ({c}instance, gpu, uuid) ({grown(recoveries, r)})"):
        if n >= 1:
            q.reasons.append(("watch", f"{n:.0f} NVLink link recoveries"))


def _pcie_and_clocks(acc: Accounting, each: Each, gpus: dict[GpuKey, GpuQuality]) -> None:
    """PCIe replays; hardware clock events against the node's other GPUs."""
    r, c = acc.range, acc.cluster_by
    for q, _, n in each(
        f"sum by ({c}instance, gpu, uuid) (increase({acc.metric('gpu_pcie_replay_errors_total')}[{r}]))"
    ):
        if n >= REPLAYS:
            q.reasons.append(("watch", f"{n:.0f} PCIe replays"))
    events = acc.metric("gpu_clock_event_reason_seconds_total", 'reason=~"' + "|".join(HW_EVENTS) + '"')
    seconds: dict[GpuKey, dict[str, float]] = {}
    for q, labels, s in each(f"sum by ({c}instance, gpu, uuid, reason) ({grown(events, r)})", "reason"):
        seconds.setdefault((q.cluster, q.instance, q.gpu), {})[labels["reason"]] = s
    for key, reasons in seconds.items():
        for reason, s in sorted(reasons.items()):
            peers = [v.get(reason, 0.0) for k, v in seconds.items() if k[:2] == key[:2] and k != key]
            base = mean(peers) if peers else 0.0
            if s - base >= CLOCK_EVENT_SECONDS:
                gpus[key].reasons.append(("watch", f"{s:.0f} s of clock event {reason} (the node's other GPUs: "
                                                   f"{base:.0f} s)"))  # fmt: skip


def _job_outliers(acc: Accounting, each: Each) -> None:
    """The GPU apart from the other GPUs of its jobs (the module's third tier): clocks held down alone, and hotter
    than the job's median, each counted at the accounting's steps over the range (a subquery), one reason each."""
    c, p = acc.cluster_by, ALERT_PARAMS
    # each GPU's job (cluster-wide ids only: a node-local id names another job on another node) and each job's size
    info = acc.metric("gpu_process_job_info", 'job_kind=~"slurm|kubernetes"')
    held = f"max by ({c}instance, gpu, uuid, job_id) ({info})"
    big = f"count by ({c}job_id) ({held}) >= {p['xid_application_outlier_gpus']}"
    throttles = acc.metric("gpu_clock_event_reason_seconds_total", 'reason=~"' + "|".join(CONDITION_REASONS) + '"')
    down = (f"(0 * (max by ({c}instance, gpu, uuid) (rate({throttles}[5m])) >= 0.5) + 1)"
            f" * on ({c}instance, gpu, uuid) group_right () {held}")  # fmt: skip
    few = f"count by ({c}job_id) ({down})"
    alone = (f"{down} and on ({c}job_id) ({few} <= 1 or {few} < {p['outlier_ratio']} * count by ({c}job_id) "
             f"({held})) and on ({c}job_id) ({big})")  # fmt: skip
    temp = f"max by ({c}instance, gpu, uuid) ({acc.metric('gpu_temperature_celsius')})"
    job_temp = f"{temp} * on ({c}instance, gpu, uuid) group_right () (0 * {held} + 1)"
    median = f"quantile by ({c}job_id) (0.5, {job_temp})"
    above = f"{job_temp} - on ({c}job_id) group_left () {median} >= {p['outlier_temperature_celsius']}"
    hot = f"({above}) and on ({c}job_id) ({big})"
    said = (
        (alone, "clocks held down while the other GPUs of its job ran at full speed"),
        (hot, f"{p['outlier_temperature_celsius']} °C or more above the median of its job's GPUs"),
    )
    for cond, text in said:
        steps = f"count_over_time((max by ({c}instance, gpu, uuid) ({cond}))[{acc.range}:{acc.step}])"
        for q, _, n in each(f"{steps} * {acc.step_s:g}"):
            if n >= OUTLIER_SECONDS:
                q.reasons.append(("watch", f"{text}: {duration(n)} of the range"))

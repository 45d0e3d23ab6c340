"""Node quality across jobs: each GPU's health and speed over a range (days, across the jobs it ran), joined into a
tier, a score and the reasons, from gpuwarden's series in Prometheus (one query per signal, every GPU at once).

Two tiers of reasons, each grounded in what its signal means:

- **service** (take the GPU out of scheduling; it needs a reset, a reboot or a technician): it could not be read
  (``gpu_up`` 0: off the bus, XID 79); an XID of the critical set (``xid_critical``, the alerts' GpuCriticalXid:
  double-bit ECC, row remap failure, NVLink, uncorrectable contained or uncontained errors, GSP faults); uncorrectable
  ECC errors (volatile); a row remap that failed; an NVLink link that went down after being up; its NVLink fabric not
  ready at the range's end.
- **watch** (it runs jobs, slower or closer to failing than its peers): the sustained straggler of at least
  ``min_jobs`` distinct jobs (the fail-slow suspects, gpuwarden.cluster.suspects); NVLink link recoveries; a row remap
  pending; PCIe replays (at least REPLAYS over the range); a PCIe link narrower than its maximum at some point; hardware
  slowdown or power brake clock events at least CLOCK_EVENT_SECONDS beyond the node's other GPUs' mean; the fabric's
  health checks reporting a problem; an XID outside the critical set.

``score`` orders GPUs, it is not a probability: 1 / (1 + 3 x service reasons + watch reasons) - 1.0 for a GPU with
no reason, 0.5 with one watch reason, 0.25 with one service reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import mean
from typing import TYPE_CHECKING

from gpuwarden.cluster.suspects import CLOCK_EVENT_SECONDS, suspects

if TYPE_CHECKING:
    from gpuwarden.cluster.usage import Accounting, Cluster, GpuKey

#: XIDs that take a GPU out of service (the alert rules' xid_critical, gpuwarden/mixin/params.yml).
XID_CRITICAL = re.compile(r"^(48|62|64|74|79|95|119|120|140)$")
#: PCIe replays over the range that make a GPU worth watching (a marginal link: signal integrity, a riser).
REPLAYS = 100
#: Hardware clock events (not power capping, which is the workload's) compared with the node's other GPUs.
HW_EVENTS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
TIERS = ("service", "watch", "good")


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
    for q, _, down in each(f"max by ({c}instance, gpu, uuid) (max_over_time(({acc.metric('gpu_up')} == bool 0)"
                           f"[{r}:{acc.step}]))"):  # fmt: skip
        if down >= 1:
            q.reasons.append(("service", "it could not be read at times (lost: off the bus, or XID 79)"))
    xids = acc.metric("gpu_xid_errors_total")
    for q, labels, n in each(f"sum by ({c}instance, gpu, uuid, xid) ({grown(xids, r)})", "xid"):
        if n >= 1:
            tier = "service" if XID_CRITICAL.match(labels["xid"]) else "watch"
            q.reasons.append((tier, f"XID {labels['xid']} ({n:.0f}x)"))
    ecc = acc.metric("gpu_ecc_errors_total", 'type="uncorrected", counter="volatile"')
    for q, _, n in each(f"max by ({c}instance, gpu, uuid) (max_over_time({ecc}[{r}]))"):
        if n >= 1:  # since the driver loaded: a reset clears the count (and remaps the rows)
            q.reasons.append(("service", f"{n:.0f} uncorrectable ECC error(s) since the driver loaded"))
    remaps = (
        ("gpu_row_remap_failure", "service", "a row remap failed"),
        ("gpu_row_remap_pending", "watch", "a row remap pending (a reset applies it)"),
    )
    for name, tier, text in remaps:
        for q, _, v in each(f"max by ({c}instance, gpu, uuid) (max_over_time({acc.metric(name)}[{r}]))"):
            if v >= 1:
                q.reasons.append((tier, text))
    _nvlink(acc, each)
    _pcie_and_clocks(acc, each, gpus)
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


def _nvlink(acc: Accounting, each: Each) -> None:
    """NVLink: links that went down after being up, link recoveries, the fabric's state and health."""
    r, c = acc.range, acc.cluster_by
    up = acc.metric("gpu_nvlink_link_up")
    for q, _, links in each(f"count by ({c}instance, gpu, uuid) ((min_over_time({up}[{r}]) == 0)"
                            f" and (max_over_time({up}[{r}]) == 1))"):  # fmt: skip
        q.reasons.append(("service", f"{links:.0f} NVLink link(s) went down"))
    recoveries = acc.metric("gpu_nvlink_link_errors_total", 'type=~"recovery|recovery_successful|recovery_failed"')
    for q, _, n in each(f"sum by ({c}instance, gpu, uuid) ({grown(recoveries, r)})"):
        if n >= 1:
            q.reasons.append(("watch", f"{n:.0f} NVLink link recoveries"))
    state = acc.metric("gpu_fabric_state", 'state!="completed"')
    for q, _, v in each(f"max by ({c}instance, gpu, uuid) (last_over_time({state}[{r}]))"):
        if v >= 1:
            q.reasons.append(("service", "its NVLink fabric is not ready"))
    health = acc.metric("gpu_fabric_health_problem")
    for q, labels, v in each(f"max by ({c}instance, gpu, uuid, check) (max_over_time({health}[{r}]))", "check"):
        if v >= 1:
            q.reasons.append(("watch", f"the NVLink fabric reported {labels['check'].replace('_', ' ')}"))


def _pcie_and_clocks(acc: Accounting, each: Each, gpus: dict[GpuKey, GpuQuality]) -> None:
    """PCIe replays and width; hardware clock events against the node's other GPUs."""
    r, c = acc.range, acc.cluster_by
    for q, _, n in each(
        f"sum by ({c}instance, gpu, uuid) (increase({acc.metric('gpu_pcie_replay_errors_total')}[{r}]))"
    ):
        if n >= REPLAYS:
            q.reasons.append(("watch", f"{n:.0f} PCIe replays"))
    width, most = acc.metric("gpu_pcie_link_width"), acc.metric("gpu_pcie_link_max_width")
    for q, _, v in each(f"max by ({c}instance, gpu, uuid) (min_over_time({width}[{r}])"
                        f" < on ({c}instance, gpu, uuid) group_left () max_over_time({most}[{r}]))"):  # fmt: skip
        q.reasons.append(("watch", f"its PCIe link narrowed to x{v:.0f}"))
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

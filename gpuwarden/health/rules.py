"""The GPU health rules, each declared once: its condition (gpuwarden.health.conditions), its severity, what the alert
says and what ``gpuwarden check`` says. Three readers take them from here:

- the alert rules (gpuwarden/mixin/rules.py writes each rule with ``alert`` an alert of gpuwarden.rules.yml: its
  ``expr`` the condition, with the GPU's job, or'ed with ``history``; a rule that waits 15 minutes or more goes to the
  ticket group, evaluated once a minute);
- ``gpuwarden check`` (gpuwarden.health.assess): one read of the GPUs, rendered as gpuwarden's samples, judged by
  every condition; a critical rule is CRITICAL, a warning WARN; ``for`` does not apply to one read;
- ``gpuwarden top --quality`` and ``check --prometheus`` (gpuwarden.cluster.quality): a rule with ``quality`` (a
  fault of the GPU itself, not of what runs on it) whose condition held, in total, at least its ``for`` (at least one
  step) over the range: a critical rule a reason to service the GPU, a warning one to watch it.

``NOT_READ`` names every other alert of the rules file and why one read cannot judge it (tests/test_health.py holds
the two to the rules file, so a new alert is placed on purpose).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.catalog import clock_event_reasons
from gpuwarden.health.conditions import Condition, Series

#: A rule's severity (the alert's label) and what it means to ``check`` and to ``top --quality``.
SEVERITIES = {"critical": ("CRITICAL", "service"), "warning": ("WARN", "watch")}
#: The alert's ``for`` at or above which it is a ticket (gpuwarden.tickets, evaluated once a minute), not a page.
TICKET_FOR_SECONDS = 900


@dataclass(frozen=True)
class HealthRule:
    """One health rule. ``name``: the alert's name (its runbook section), or for a rule only ``check`` reads, a name of
    its own. ``when``: its condition on one GPU. ``severity``: critical or warning (SEVERITIES). ``finding``: what
    ``check`` says of a GPU that meets it, a ``str.format`` text with ``value`` (the condition's series' value),
    ``than`` (the value it was compared with, where another series), ``gib`` (value / 2**30) and each label of the
    matching series (several series: their distinct values joined with ", "), and of ``names``'s series of the GPU;
    ``action``: what to do next. ``quality``: a fault of the GPU that ``top --quality`` weighs over a range.

    For an alert (``alert`` True): ``summary`` and ``description`` (its annotations: Prometheus templates, and the
    mixin's ``@{parameters}``), ``for_`` and ``keep_firing_for`` (durations, "" for none), ``history`` (PromQL or'ed
    with the condition: what one read cannot see, such as an XID event of the last 15 minutes). For a rule that is no
    alert, ``why`` says why not."""

    name: str
    when: Condition
    severity: str
    finding: str
    action: str
    quality: bool = True
    alert: bool = True
    summary: str = ""
    description: str = ""
    for_: str = ""
    keep_firing_for: str = ""
    history: str = ""
    names: Series | None = None
    why: str = ""

    @property
    def level(self) -> str:
        """``check``'s level: CRITICAL or WARN."""
        return SEVERITIES[self.severity][0]

    @property
    def tier(self) -> str:
        """``top --quality``'s tier: service or watch."""
        return SEVERITIES[self.severity][1]


_HEAT = "check airflow, fans, inlet temperature and neighbouring cards (nvidia-smi -q -d TEMPERATURE)"
_DRAIN_SERVICE = "drain the node and service the GPU"

RULES: tuple[HealthRule, ...] = (
    # Pages: the GPU needs a person now.
    HealthRule(
        "GpuOverheating",
        Condition(
            Series("gpu_temperature_celsius"),
            ">=",
            "hot_margin_celsius",
            than=Series("gpu_temperature_threshold_celsius", (("threshold", "=", "slowdown"),)),
            ignoring=("threshold",),
        ),  # fmt: skip
        "critical",
        "GPU at {value:.0f} °C, its slowdown at {than:.0f} °C",
        _HEAT,
        summary="GPU is within @{hot_margin_celsius} °C of its own slowdown temperature.",
        description="GPU {{ $labels.gpu }} on {{ $labels.instance }} is at {{ $value }} °C, within "
        "@{hot_margin_celsius} °C of the temperature at which the card slows its clocks.",
        for_="2m",
        keep_firing_for="15m",
    ),
    HealthRule(
        "GpuMemoryOverheating",
        Condition(
            Series("gpu_memory_temperature_celsius"),
            ">=",
            "hot_margin_celsius",
            than=Series("gpu_temperature_threshold_celsius", (("threshold", "=", "memory_max"),)),
            ignoring=("threshold",),
        ),  # fmt: skip
        "critical",
        "HBM at {value:.0f} °C, its limit {than:.0f} °C",
        _HEAT,
        summary="GPU memory (HBM) is within @{hot_margin_celsius} °C of its own maximum.",
        description="The memory of GPU {{ $labels.gpu }} on {{ $labels.instance }} is at {{ $value }} °C, within "
        "@{hot_margin_celsius} °C of its maximum operating temperature.",
        for_="2m",
        keep_firing_for="15m",
    ),
    HealthRule(
        "GpuHardwareSlowdown",
        Condition(
            Series("gpu_clock_event_reason_active", (("reason", "=~", "|".join(clock_event_reasons("hardware"))),)),
            "==",
            1,
        ),  # fmt: skip
        "warning",
        "clock event {reason} holds the clocks down",
        "check the power supply and cooling (nvidia-smi -q -d PERFORMANCE)",
        quality=False,  # top --quality weighs these events' seconds against the node's other GPUs instead
        summary="GPU clocks are held down by hardware slowdown or power brake.",
        description="GPU {{ $labels.gpu }} on {{ $labels.instance }} reports {{ $labels.reason }}.",
        for_="10m",
    ),
    HealthRule(
        "GpuLost",
        Condition(Series("gpu_up"), "==", 0),
        "critical",
        "the GPU cannot be read (NVML: lost, or off the bus)",
        "drain the node; check dmesg for XID 79 and PCIe errors, reset the GPU (nvidia-smi -r) or reboot",
        summary="A GPU cannot be read (lost, or fallen off the bus).",
        description="GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }} does not answer NVML. XIDs "
        'it reported since gpuwarden started: {{ range printf "gpu_xid_errors_total{instance=%q,uuid=%q} > 0" '
        "$labels.instance $labels.uuid | query }}{{ .Labels.xid }} {{ else }}none{{ end }}.",
        for_="1m",
        keep_firing_for="15m",
        # XID 79 (fallen off the bus) of the last 15 minutes: its series appears with the event, so the time of the
        # last event is read (increase() of a counter that appears at 1 is 0)
        history='max without (xid) (time() - gpu_xid_last_event_timestamp_seconds{@{selector}xid="79"} < 900)',
    ),
    HealthRule(
        "GpuRecoveryActionNeeded",
        Condition(Series("gpu_recovery_action"), ">", 0),
        "critical",
        "the driver asks for recovery action {value:.0f} (1 a GPU reset, 2 a node reboot, 3 peer-to-peer traffic "
        "drained, 4 the GPU drained and reset)",
        "drain the node, then do what the driver asks",
        summary="The driver asks for a GPU reset, a node reboot or a drain.",
        description="GPU {{ $labels.gpu }} on {{ $labels.instance }} reports recovery action {{ $value }} (1 GPU "
        "reset, 2 node reboot, 3 drain peer-to-peer, 4 drain and reset).",
        keep_firing_for="15m",
    ),
    HealthRule(
        "GpuUncorrectableEccErrors",
        Condition(Series("gpu_ecc_errors_total", (("type", "=", "uncorrected"), ("counter", "=", "volatile"))), ">", 0),
        "critical",
        "{value:.0f} uncorrectable ECC error(s) since the driver loaded",
        "drain the GPU and reset it (nvidia-smi -r) so rows are remapped; replace it if errors return",
        summary="GPU memory has uncorrectable ECC errors since the driver loaded.",
        description="GPU {{ $labels.gpu }} on {{ $labels.instance }} counts {{ $value }} uncorrectable ECC errors "
        "since its last reset; the count clears only when the GPU is reset.",
        keep_firing_for="15m",
    ),
    HealthRule(
        "GpuRowRemapFailure",
        Condition(Series("gpu_row_remap_failure"), "==", 1),
        "critical",
        "a row remap failed",
        _DRAIN_SERVICE,
        summary="A GPU memory row could not be remapped.",
        description="GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }} needs service.",
        keep_firing_for="15m",
    ),
    # Tickets: the node needs a look within the day.
    HealthRule(
        "GpuMemoryHeldWithoutProcess",
        Condition(
            Series("gpu_memory_used_bytes"),
            ">",
            "held_idle_min_bytes",
            also=Condition(Series("gpu_compute_processes"), "==", 0),
        ),  # fmt: skip
        "warning",
        "{gib:.1f} GiB used with no process visible",
        "a process in another PID namespace holds it, or a dead one left it: find it (nvidia-smi on the host)",
        quality=False,  # what runs on the node, not the GPU
        summary="GPU memory is in use but no process holds the GPU.",
        description="GPU {{ $labels.gpu }} on {{ $labels.instance }} has {{ $value | humanize1024 }}B in use and no "
        "compute process: a process outside this node's view (another PID namespace without hostPID), or memory "
        "left by a process that died.",
        for_="30m",
    ),
    HealthRule(
        "GpuRowRemapPending",
        Condition(Series("gpu_row_remap_pending"), "==", 1),
        "warning",
        "a row remap is pending (a reset applies it)",
        "reset the GPU when it is free",
        summary="A GPU memory row remap waits for a GPU reset.",
        description="GPU {{ $labels.gpu }} on {{ $labels.instance }} has a pending row remap; reset it when drained.",
        for_="15m",
    ),
    HealthRule(
        "GpuPcieLinkDegraded",
        # the width only: the link's generation drops at idle to save power
        Condition(Series("gpu_pcie_link_width"), "<", than=Series("gpu_pcie_link_max_width")),
        "warning",
        "PCIe link at x{value:.0f} of x{than:.0f}",
        "reseat the GPU or its riser; check the slot (lspci -vv: LnkSta)",
        summary="A GPU's PCIe link runs narrower than it can.",
        description="GPU {{ $labels.gpu }} on {{ $labels.instance }} runs its PCIe link at x{{ $value }}, below its "
        "maximum: host-to-device copies are slower (a reseat, a riser or a slot problem).",
        for_="15m",
    ),
    HealthRule(
        "GpuFabricNotReady",
        Condition(Series("gpu_fabric_state", (("state", "!=", "completed"),)), "==", 1),
        "critical",
        "the NVLink fabric is in state {state}",
        "check the fabric manager (nvidia-fabricmanager) or IMEX service and the NVSwitch trays; restart it, then "
        "reset the GPU if the state stays",
        summary="A GPU's NVLink fabric has not come up.",
        description="GPU {{ $labels.gpu }} on {{ $labels.instance }} has been in fabric state {{ $labels.state }} "
        "for 15 minutes: it has not joined its NVLink domain, and jobs that need it (multi-node NVLink) fail on it.",
        for_="15m",
    ),
    HealthRule(
        "GpuFabricUnhealthy",
        Condition(Series("gpu_fabric_health_problem"), "==", 1),
        "warning",
        "the NVLink fabric reports {check}",
        "the fabric manager's log names the link or switch; plan service",
        summary="A GPU's NVLink fabric reports a health problem.",
        description="GPU {{ $labels.gpu }} on {{ $labels.instance }}: the fabric's health check {{ $labels.check }} "
        "has reported a problem for 15 minutes (degraded bandwidth, a route recovering or unhealthy, an access "
        "timeout recovered).",
        for_="15m",
    ),
    # Read by check only: normal while a job runs, a finding before one starts.
    HealthRule(
        "GpuHeldBeforeJob",
        Condition(Series("gpu_compute_processes"), ">", 0),
        "warning",
        "{value:.0f} process(es) hold the GPU (the largest: {process_name}, pid {pid})",  # ?: NVML gave no memory
        "if no job should hold it, end them (an earlier job's leftovers)",
        quality=False,
        alert=False,
        names=Series("gpu_process_memory_used_bytes"),
        why="processes hold a GPU while their job runs: only before a job are they leftovers",
    ),
    HealthRule(
        "GpuNvlinkLinksInactive",
        Condition(Series("gpu_nvlink_link_up"), "==", 0, also=Condition(Series("gpu_nvlink_link_up"), "==", 1)),
        "warning",
        "NVLink link(s) {link} inactive while others of the GPU are active",
        "nvidia-smi nvlink -s; drain and reset the GPU; a link that stays down needs service",
        quality=False,  # top --quality reads the links that went down after being up
        alert=False,
        why="a GPU may wire only some of its links (a bridge): the alert, GpuNvlinkLinkDown, compares the links up "
        "with the last day instead; one read can only compare them with each other",
    ),
)
#: Every other alert of the rules file, and why one read at a job's start cannot judge it. ``check --prometheus``
#: adds the history of ``top --quality`` (errors, links, fail-slow) to the read.
NOT_READ = {
    "GpuThermalSlowdown": "a job's own heat over minutes: nothing to read before it starts",
    "GpuCriticalXid": "an event within a job, not a state: --prometheus reads the history",
    "GpuXidErrors": "an event within a job, not a state: --prometheus reads the history",
    "GpuJobApplicationXid": "a job's code across its GPUs, for its owner",
    "GpuApplicationXidOutlier": "a GPU against the other GPUs of its job: --prometheus reads them",
    "GpuHotterThanItsJob": "a GPU against the other GPUs of its job, over minutes",
    "GpuThrottledAloneInJob": "a GPU's clock events against the other GPUs of its job, over minutes",
    "GpuSiteUnitHot": "a rack's or row's GPUs together (check reads its node's: GpuOverheating)",
    "GpuNvlinkDomainNotReady": "an NVLink domain's GPUs together (check reads its node's: GpuFabricNotReady)",
    "GpuNvlinkDomainUnhealthy": "an NVLink domain's GPUs together (check reads its node's: GpuFabricUnhealthy)",
    "GpuNvlinkLinkDown": "fewer links up than in the last day (check compares the links of one read: "
    "GpuNvlinkLinksInactive)",
    "GpuNvlinkLinkRecovering": "a count over time: --prometheus reads the history",
    "GpuNvlinkErrors": "a count over time: --prometheus reads the history",
    "GpuPcieReplays": "a count over time: --prometheus reads the history",
    "GpuSuspectFailSlow": "a straggler across jobs: --prometheus reads the history",
    "GpuMissing": "a GPU the node had: check reads the GPUs there are (--gpus names the ones a job expects)",
    "GpuMemoryFillingUp": "a job's memory over time, not the next job's readiness",
    "GpuMemoryAlmostFull": "a job's memory, not the next job's readiness",
    "GpuMemoryHeldIdle": "a job's use over an hour, for its owner",
    "GpuAllocatedIdle": "a job's use over an hour, for its owner",
    "GpuStarved": "a job's efficiency, not a fault",
    "GpuJobImbalanced": "a job's efficiency, not a fault",
    "GpuJobImbalancedAcrossNodes": "a job's efficiency, not a fault",
    "GpuHealthTelemetryMissing": "the exporter's readings over time (check fails on what it cannot read)",
    "GpuHealthTelemetryFailing": "the exporter's readings over time (check fails on what it cannot read)",
    "GpuwardenDown": "the daemon, not the GPU",
    "GpuwardenNvmlDown": "the daemon, not the GPU (check reads NVML itself)",
    "GpuwardenCollectionStale": "the daemon, not the GPU",
    "GpuwardenCollectorFailing": "the daemon, not the GPU",
    "GpuwardenNvmlErrors": "the daemon, not the GPU",
    "GpuwardenUsageRecordsBehind": "the rule evaluation of Prometheus, not the GPU",
}

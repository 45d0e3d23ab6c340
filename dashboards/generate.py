"""Generates the Grafana dashboards of gpuwarden/mixin/dashboards/*.json with grafana-foundation-sdk (typed builders
that follow Grafana's dashboard schema).

Run ``python3 dashboards/generate.py`` after editing; tests/test_dashboards.py checks the JSON files are what this
script writes and lints them (units, thresholds, hidden table columns, $__rate_interval, variables, links), and
tests/test_e2e_prometheus.py runs every query against a real Prometheus for every variable value.

Conventions the tests hold the dashboards to:

- every stat has thresholds; a stat that counts trouble (a lost GPU, an ECC error, a failed remap) turns red at 1;
- tables hide ``Time``, ``__name__`` and the labels nobody reads (uuid, scrape job);
- a panel draws the non-zero or active series only (XIDs, clock event reasons) next to one total that is always
  there, so a healthy GPU shows 0 rather than "No data";
- the per-node view shows one node; every per-GPU time series carries a "lost" series, so a GPU that fell off the
  bus reads "GPU 3 lost" on each panel instead of an empty one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as gc
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as mc
from grafana_foundation_sdk.models import dashboard as md
from grafana_foundation_sdk.models import prometheus as mp

from gpuwarden.catalog import CONDITION_REASONS, THROTTLE_REASONS
from gpuwarden.insight.vocabulary.thresholds import ALERT_PARAMS

OUT = Path(__file__).parent.parent / "gpuwarden" / "mixin" / "dashboards"
DS = md.DataSourceRef(type_val="prometheus", uid="${datasource}")
#: Clock event reasons that hold clocks down (NVML's "throttle" reasons; gpuwarden.catalog.CLOCK_EVENT_GROUPS).
THROTTLE = "|".join(THROTTLE_REASONS)
#: Columns no table shows: the sample time of an instant query, the metric name, and labels for machines.
HIDDEN_COLUMNS = ("Time", "__name__", "job", "uuid", "scenario", "container_id")
RED = "red"
GREEN = "green"

Panel = Any  # a grafana_foundation_sdk panel builder (stat, timeseries, table, state timeline)


def steps(*pairs: tuple[float | None, str]) -> gd.ThresholdsConfig:
    """Absolute thresholds: (lower bound, colour) pairs, the first with bound None (-Infinity)."""
    return gd.ThresholdsConfig().mode(md.ThresholdsMode.ABSOLUTE).steps([md.Threshold(v, c) for v, c in pairs])


#: A count of trouble: green at 0, red from 1.
TROUBLE = steps((None, GREEN), (1, RED))
#: A neutral count (GPUs, models): one colour.
NEUTRAL = steps((None, "blue"))


class Layout:
    """Places panels left to right in rows of 24 columns, and numbers them."""

    def __init__(self) -> None:
        self.x = self.y = self.row_h = 0
        self.panels: list[Panel] = []

    def add(self, p: Panel, w: int, h: int) -> None:
        """Put a panel w columns wide and h rows high after the last one (a new row when it does not fit)."""
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        p.id(len(self.panels) + 1).grid_pos(md.GridPos(h=h, w=w, x=self.x, y=self.y))
        self.x += w
        self.row_h = max(self.row_h, h)
        self.panels.append(p)


#: Every gpuwarden series a panel selects by scrape job is selected by cluster too (the ``cluster`` variable: a
#: Prometheus that scrapes several clusters, or Thanos/Mimir over several, with ``cluster`` as a target or external
#: label; where no series carries one, its "All" matches everything).
BY_JOB = 'job=~"$job"'
BY_CLUSTER = 'job=~"$job", cluster=~"$cluster"'


def query(expr: str, ref: str, legend: str = "", table: bool = False) -> prometheus.Dataquery:
    """One PromQL query of a panel: a range query with its legend, or an instant query formatted as a table; every
    selector by scrape job selects by cluster too."""
    q = prometheus.Dataquery().expr(expr.replace(BY_JOB, BY_CLUSTER))
    q = q.instant().format(mp.PromQueryFormat.TABLE) if table else q.legend_format(legend)
    return q.ref_id(ref).datasource(DS)


def queries(p: Panel, exprs: Sequence[tuple[str, str]], table: bool = False) -> Panel:
    """Attach the PromQL queries (expr, legend) to a panel as refIds A, B, ... (tables: instant, no legend)."""
    for i, (expr, legend) in enumerate(exprs):
        p.with_target(query(expr, chr(65 + i), legend, table))
    return p


def common(p: Panel, title: str, unit: str, desc: str) -> Panel:
    """Title, unit, description and the datasource variable of every panel."""
    return p.title(title).unit(unit).description(desc).datasource(DS)


def ts(title: str, exprs: Sequence[tuple[str, str]], unit: str, desc: str = "", **kw: Any) -> Panel:
    """A time series panel; ``limits`` (thresholds drawn as lines; with ``mark``, each line coloured by the
    threshold its values pass, so the series past a limit stands out), ``min``/``max`` and ``stack`` are optional."""
    p = common(timeseries.Panel(), title, unit, desc)
    queries(p, exprs)
    if "limits" in kw:
        p.thresholds(kw["limits"])
        p.thresholds_style(gc.GraphThresholdsStyleConfig().mode(mc.GraphThresholdsStyleMode.LINE))
        if kw.get("mark"):
            p.color_scheme(gd.FieldColor().mode(md.FieldColorModeId.THRESHOLDS))
    if "min" in kw:
        p.min(kw["min"])
    if "max" in kw:
        p.max(kw["max"])
    if kw.get("stack"):
        p.stacking(gc.StackingConfig().mode(mc.StackingMode.NORMAL)).fill_opacity(60)
    if kw.get("lost_of"):
        # the "lost" series of a per-GPU panel: drawn as red points at 0
        p.with_target(query(f"gpu_up{{{kw['lost_of']}}} == 0", "LOST", "GPU {{gpu}} lost: no readings"))
        p.override_by_query(
            "LOST",
            [
                md.DynamicConfigValue("color", {"mode": "fixed", "fixedColor": RED}),
                md.DynamicConfigValue("custom.drawStyle", "points"),
                md.DynamicConfigValue("custom.pointSize", 8),
            ],
        )
    return p


def st(title: str, exprs: Sequence[tuple[str, str]], unit: str, thresholds: gd.ThresholdsConfig, desc: str = "",
       **kw: Any) -> Panel:  # fmt: skip
    """A stat panel (last value, coloured by its thresholds); ``names`` shows each series' legend with its value."""
    p = common(stat.Panel(), title, unit, desc).thresholds(thresholds).color_mode(mc.BigValueColorMode.BACKGROUND)
    p.graph_mode(mc.BigValueGraphMode.NONE)
    p.text_mode(mc.BigValueTextMode.VALUE_AND_NAME if kw.get("names") else mc.BigValueTextMode.AUTO)
    if "mappings" in kw:
        p.mappings(kw["mappings"])
    return queries(p, exprs)


def tbl(title: str, exprs: Sequence[tuple[str, str]], unit: str, desc: str = "", links: Sequence[gd.DashboardLink] = (),
        rename: dict[str, str] | None = None) -> Panel:  # fmt: skip
    """A table of an instant query: one row per series, its labels as columns, the machine columns hidden."""
    p = queries(common(table.Panel(), title, unit, desc).thresholds(NEUTRAL), exprs, table=True)
    p.with_transformation(
        md.DataTransformerConfig(
            id_val="organize",
            options={"excludeByName": dict.fromkeys(HIDDEN_COLUMNS, True), "renameByName": rename or {}},
        )
    )
    if links:
        p.data_links(list(links))
    return p


def timeline(title: str, exprs: Sequence[tuple[str, str]], unit: str, desc: str = "") -> Panel:
    """A state timeline (one row per series)."""
    return queries(common(statetimeline.Panel(), title, unit, desc).thresholds(NEUTRAL), exprs)


def link(title: str, url: str) -> gd.DashboardLink:
    """A dashboard or data link; keeps the time range."""
    return gd.DashboardLink(title).type(md.DashboardLinkType.LINK).url(url).keep_time(True)


def job_link() -> gd.DashboardLink:
    """A data link from a row with a job_id (and, for a node-local id, its instance) to the job view; the values are
    percent-encoded (cgroup paths hold '/')."""
    return gd.DashboardLink("Job view").url(
        "/d/gpuwarden-job?var-job_id=${__data.fields.job_id:percentencode}"
        "&var-instance=${__data.fields.instance:percentencode}&${__url_time_range}"
    )


def node_link() -> gd.DashboardLink:
    """A data link from a row with an instance to the node view of that node."""
    return gd.DashboardLink("Node view").url(
        "/d/gpuwarden-node?var-instance=${__data.fields.instance:percentencode}&${__url_time_range}"
    )


def var_ds() -> gd.DatasourceVariable:
    """The datasource variable every query uses."""
    return gd.DatasourceVariable("datasource").label("Data source").type("prometheus")


def var(name: str, query: str, multi: bool = True) -> gd.QueryVariable:
    """A query variable over label values; refreshed with the time range.

    A multi-value variable has "All" (``.*``) and is matched with ``=~`` (Grafana regex-escapes it); a single-value
    one has no "All" and is matched with ``=`` (Grafana inserts it as is).
    """
    v = gd.QueryVariable(name).label(name).datasource(DS).query(query).refresh(md.VariableRefresh.ON_TIME_RANGE_CHANGED)
    v.sort(md.VariableSort.ALPHABETICAL_ASC).multi(multi).include_all(multi)
    return v.all_value(".*") if multi else v


def cluster_and_job() -> list[gd.QueryVariable]:
    """The ``cluster`` variable (label values of ``cluster``, "All" matching series without one) and the scrape
    ``job`` variable within it."""
    return [var("cluster", "label_values(gpu_devices, cluster)"),
            var("job", 'label_values(gpu_up{cluster=~"$cluster"}, job)')]  # fmt: skip


def slurm_job_var() -> gd.TextBoxVariable:
    """The job view's "Slurm job" box: a Slurm job's number (``slurm_job_id``, read where a daemon could) narrows
    the job ids to that job's, its SLUID on Slurm 26.05+; ``.*`` (the default) leaves every id."""
    return gd.TextBoxVariable("slurm_job_id").label("Slurm job").default_value(".*")


def dashboard(uid: str, title: str, description: str, variables: list[Any], layout: Layout) -> gd.Dashboard:
    """A dashboard with the three views' links, 6 hours, refreshing every 30 s."""
    d = gd.Dashboard(title).uid(uid).description(description).tags(["gpuwarden", "gpu"]).editable()
    d.timezone("browser").refresh("30s").time("now-6h", "now")
    for v in variables:
        d.with_variable(v)
    for t, u, with_vars in (
        ("GPU fleet", "/d/gpuwarden-fleet", False),
        ("GPU node", "/d/gpuwarden-node", True),
        ("GPU job", "/d/gpuwarden-job", True),
    ):
        d.link(link(t, u).include_vars(with_vars))
    for p in layout.panels:
        d.with_panel(p)
    return d


# ---------------------------------------------------------------------------------------------------------- fleet


def fleet() -> gd.Dashboard:
    """Fleet overview: GPUs lost and needing a reset, states, starved GPU-hours, worst jobs, throttling, headroom."""
    sel = 'job=~"$job", instance=~"$instance"'
    lay = Layout()
    lay.add(st("GPUs", [(f"count(gpu_up{{{sel}}})", "GPUs")], "short", NEUTRAL, "GPUs gpuwarden watches."), 3, 4)
    lay.add(
        st("GPUs lost", [(f"count(gpu_up{{{sel}}} == 0) or vector(0)", "lost")], "short", TROUBLE,
           "GPUs that cannot be read (fallen off the bus, XID 79): GpuLost pages."),
        3, 4,
    )  # fmt: skip
    lay.add(
        st(
            "GPU health",
            [
                (f'sum(gpu_ecc_errors_total{{{sel}, type="uncorrected", counter="volatile"}}) or vector(0)',
                 "uncorrectable ECC errors"),
                (f"count(gpu_row_remap_pending{{{sel}}} == 1) or vector(0)", "remap pending"),
                (f"count(gpu_row_remap_failure{{{sel}}} == 1) or vector(0)", "remap failed"),
                (f"count(gpu_recovery_action{{{sel}}} > 0) or vector(0)", "recovery asked"),
            ],
            "short",
            TROUBLE,
            "Uncorrectable ECC errors since the last driver load or reset (the GPU needs a reset while they are "
            "there); GPUs waiting for a reset to remap rows; GPUs out of spare rows (RMA); GPUs whose driver asks "
            "for a recovery.",
            names=True,
        ),
        10, 4,
    )  # fmt: skip
    lay.add(
        st("Busy share in range",
           [(f'(sum(increase(gpu_state_seconds_total{{{sel}, state="busy"}}[$__range])) or vector(0)) / '
             f"sum(increase(gpu_state_seconds_total{{{sel}}}[$__range]))", "busy")],
           "percentunit", steps((None, RED), (0.5, "orange"), (0.8, GREEN)),
           "Share of the accounted GPU time in which a kernel ran."),
        4, 4,
    )  # fmt: skip
    lay.add(
        st("Starved GPU-hours in range",
           [(f'(sum(increase(gpu_state_seconds_total{{{sel}, state="starved"}}[$__range])) or vector(0)) / 3600',
             "GPU-hours")],
           "h", steps((None, GREEN), (1, "orange"), (24, RED)),
           "GPU time spent idle while the job holding the GPU worked (waiting on input, CPU, peers)."),
        4, 4,
    )  # fmt: skip
    lay.add(
        st("Held-idle GPU-hours in range",
           [(f'(sum(increase(gpu_idle_seconds_total{{{sel}, cause="held_idle"}}[$__range])) or vector(0)) / 3600',
             "GPU-hours")],
           "h", steps((None, GREEN), (1, "orange"), (24, RED)),
           "GPU time held by a job's memory while nothing ran on it (a sleeping notebook, a stopped job)."),
        6, 4,
    )  # fmt: skip
    lay.add(
        st("Cost of lost GPU-hours in range",
           [(f'sum by (currency) (sum by (instance) (increase(gpu_idle_seconds_total{{{sel}, cause!="free"}}'
             "[$__range])) / 3600 * on (instance) group_left (currency)"
             f" max by (instance, currency) (max_over_time(gpuwarden_gpu_hour_price{{{sel}}}[$__range])))",
             "{{currency}}")],
           "short", NEUTRAL, "Lost GPU-hours (held but idle, every cause) times each node's price_per_gpu_hour "
           "(gpuwarden_gpu_hour_price, over the range: a node gone since counts); nodes without a price are left "
           "out.", names=True),
        6, 4,
    )  # fmt: skip
    lay.add(
        ts("GPUs by state",
           [(f"sum by (state) (rate(gpu_state_seconds_total{{{sel}}}[$__rate_interval]))", "{{state}}")],
           "short", "GPU-seconds per second in each state (busy, starved, held_idle, free, lost, unknown): a number of "
           "GPUs. States: docs/scores.md.", stack=True),
        12, 8,
    )  # fmt: skip
    lay.add(
        ts("SM activity by node",
           [(f"avg by (instance) (gpu_sm_activity_ratio{{{sel}}} or gpu_utilization_ratio{{{sel}}})", "{{instance}}")],
           "percentunit", "Mean SM activity of each node's GPUs (GPM, Hopper and later), util.gpu where there is no "
           "GPM. DCGM: below 0.5 the GPU is likely used ineffectively.", min=0, max=1),
        12, 8,
    )  # fmt: skip
    lay.add(
        tbl("Most starved jobs", [("topk(10, job_id:gpu_starved_ratio:avg)", "")], "percentunit",
            "Mean starved ratio of each job's GPUs (recording rule; a cluster-wide job over all its nodes).",
            links=[job_link()], rename={"Value": "starved"}),
        8, 8,
    )  # fmt: skip
    lay.add(
        tbl("Most imbalanced jobs",
            [("topk(10, job_id:gpu_imbalance_ratio:across_nodes"
              " or max by (instance, job_id) (gpu_job_imbalance_ratio))", "")],
            "percentunit", "(1 - mean/max) * n/(n-1) of the SM activity of each job's GPUs: 0 balanced, 1 one GPU "
            "does all the work.", links=[job_link()], rename={"Value": "imbalance"}),
        8, 8,
    )  # fmt: skip
    lay.add(
        tbl("Most starved GPUs", [(f"topk(10, gpu_starved_ratio{{{sel}}})", "")], "percentunit",
            "Share of the last 5 minutes each GPU waited while its job worked.", links=[node_link()],
            rename={"Value": "starved"}),
        8, 8,
    )  # fmt: skip
    lay.add(
        ts("Throttled GPUs by reason",
           [(f'count by (reason) (gpu_clock_event_reason_active{{{sel}, reason=~"{THROTTLE}"}} == 1)', "{{reason}}"),
            (f'count(max by (instance, gpu) (gpu_clock_event_reason_active{{{sel}, reason=~"{THROTTLE}"}}) == 1)'
             " or vector(0)", "throttled GPUs")],
           "short", "GPUs whose clocks a power cap, heat or a hardware signal holds down; only active reasons are "
           "drawn."),
        12, 8,
    )  # fmt: skip
    lay.add(
        ts("Memory headroom of the fullest GPU per node",
           [(f"instance:gpu_memory_headroom_ratio:min{{{sel}}}", "{{instance}}")],
           "percentunit", "GpuMemoryAlmostFull opens a ticket below 10% (a plateau is normal for caching "
           "allocators); GpuMemoryFillingUp pages when it heads for 0. From the rules' record (one series a node: a "
           "fleet's range reads in a fraction of the time the GPUs' series take).",
           limits=steps((None, RED), (0.1, GREEN)),
           min=0, max=1),
        12, 8,
    )  # fmt: skip
    lay.add(
        ts("XID errors",
           [(f"round(sum by (instance, gpu, xid) (increase(gpu_xid_errors_total{{{sel}}}[$__rate_interval]))) > 0",
             "{{instance}} GPU {{gpu}} XID {{xid}}"),
            (f"round(sum(increase(gpu_xid_errors_total{{{sel}}}[$__rate_interval])) or vector(0))", "all XIDs")],
           "short", "XID errors per interval; only codes that occurred are drawn per GPU. Tiers: docs/runbook.md."),
        12, 8,
    )  # fmt: skip
    lay.add(
        tbl("GPU models", [(f"count by (name, architecture) (gpu_info{{{sel}}})", "")], "short",
            "GPUs of each model.", rename={"Value": "GPUs"}),
        12, 8,
    )  # fmt: skip
    lay.add(
        timeline("NVML readable", [(f"gpuwarden_source_up{{{sel}}}", "{{instance}}")], "bool_yes_no",
                 "Whether each node's gpuwarden can read NVML."),
        12, 8,
    )  # fmt: skip
    lay.add(
        ts("Age of the last successful poll",
           [(f"time() - gpuwarden_last_poll_success_timestamp_seconds{{{sel}}}", "{{instance}}")], "s",
           "GpuwardenCollectionStale warns above 10 poll intervals (at least 60 s)."),
        12, 8,
    )  # fmt: skip
    return dashboard(
        "gpuwarden-fleet", "GPU fleet (gpuwarden)", "Every node's GPUs: health, states, lost time, worst jobs.",
        [var_ds(), *cluster_and_job(),
         var("instance", f"label_values(gpu_up{{{BY_CLUSTER}}}, instance)")],
        lay,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------------------- node

RECOVERY = md.ValueMap(
    {
        "0": md.ValueMappingResult(text="none", color=GREEN),
        "1": md.ValueMappingResult(text="GPU reset", color=RED),
        "2": md.ValueMappingResult(text="node reboot", color=RED),
        "3": md.ValueMappingResult(text="drain P2P", color="orange"),
        "4": md.ValueMappingResult(text="drain and reset", color=RED),
    }
)


def node() -> gd.Dashboard:
    """Node view: one node's GPUs, their health, readings against their limits, processes and jobs."""
    sel = 'job=~"$job", instance="$instance"'
    g = sel + ', gpu=~"$gpu"'
    leg = "GPU {{gpu}}"
    lay = Layout()
    lay.add(
        st("GPU model", [(f"count by (name) (gpu_info{{{g}}})", "{{name}}")], "short", NEUTRAL,
           "Model and number of the selected GPUs.", names=True),
        6, 4,
    )  # fmt: skip
    lay.add(st("GPUs lost", [(f"count(gpu_up{{{g}}} == 0) or vector(0)", "lost")], "short", TROUBLE,
               "GPUs that cannot be read: GpuLost pages."), 3, 4)  # fmt: skip
    lay.add(
        st("Uncorrectable ECC errors",
           [(f'sum(gpu_ecc_errors_total{{{g}, type="uncorrected", counter="volatile"}}) or vector(0)', "errors")],
           "short", TROUBLE, "Since the last driver load or GPU reset; they stay until the GPU is reset."),
        3, 4,
    )  # fmt: skip
    lay.add(
        st("Row remapping",
           [(f"count(gpu_row_remap_pending{{{g}}} == 1) or vector(0)", "pending"),
            (f"count(gpu_row_remap_failure{{{g}}} == 1) or vector(0)", "failed")],
           "short", TROUBLE, "GPUs waiting for a reset to remap rows; GPUs out of spare rows (RMA).", names=True),
        4, 4,
    )  # fmt: skip
    lay.add(
        st("Critical XIDs since start",
           [(f'sum(gpu_xid_errors_total{{{g}, xid=~"48|62|64|74|79|95|119|120|140|154"}}) or vector(0)', "XIDs")],
           "short", TROUBLE, "XIDs of the critical tier (docs/runbook.md) since gpuwarden started."),
        4, 4,
    )  # fmt: skip
    lay.add(
        st("Recovery asked", [(f"max(gpu_recovery_action{{{g}}}) or vector(0)", "action")], "short", TROUBLE,
           "The recovery the driver asks for (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION).", mappings=[RECOVERY]),
        4, 4,
    )  # fmt: skip
    lay.add(
        timeline("Verdict of each GPU", [(f"gpu_diagnosis{{{g}}} == 1", leg + " {{reason}}")], "bool_on_off",
                 "The verdict and findings of each GPU (docs/scores.md); `gpuwarden diagnose` names the remedies."),
        24, 8,
    )  # fmt: skip
    lay.add(
        ts("Utilization vs SM activity",
           [(f"gpu_utilization_ratio{{{g}}}", leg + " util.gpu"),
            (f"gpu_sm_activity_ratio{{{g}}}", leg + " SM activity")],
           "percentunit", "util.gpu says a kernel ran; SM activity how much of the GPU it used.", min=0, max=1,
           lost_of=g),
        12, 8,
    )  # fmt: skip
    lay.add(
        ts("GPU time by state",
           [(f"sum by (state) (rate(gpu_state_seconds_total{{{g}}}[$__rate_interval]))"
             f" / scalar(sum(rate(gpu_state_seconds_total{{{g}}}[$__rate_interval])))", "{{state}}")],
           "percentunit", "Share of the selected GPUs' accounted time in each state (busy, starved, held_idle, free, "
           "lost): the shares add to 100%.",
           stack=True, min=0, max=1),
        12, 8,
    )  # fmt: skip
    lay.add(
        ts("Memory used", [(f"gpu_memory_used_bytes{{{g}}} / gpu_memory_total_bytes{{{g}}}", leg)], "percentunit",
           "GpuMemoryAlmostFull opens a ticket above 90% (the red line); a steady plateau of a working job is "
           "normal.", limits=steps((None, GREEN), (0.9, RED)), min=0, max=1, lost_of=g),
        12, 8,
    )  # fmt: skip
    lay.add(
        ts("Tensor and memory activity",
           [(f"gpu_tensor_activity_ratio{{{g}}}", leg + " tensor"), (f"gpu_dram_activity_ratio{{{g}}}", leg + " DRAM"),
            (f"gpu_memory_copy_utilization_ratio{{{g}}} unless on (instance, gpu) gpu_dram_activity_ratio",
             leg + " util.memory")],
           "percentunit", "Tensor pipe and DRAM activity from GPM (Hopper and later); elsewhere util.memory, the "
           "share of time the memory controller was busy.", min=0, max=1, lost_of=g),
        12, 8,
    )  # fmt: skip
    lay.add(
        ts("Temperature against its limits",
           [(f"gpu_temperature_celsius{{{g}}}", leg),
            (f'gpu_temperature_threshold_celsius{{{g}, threshold="slowdown"}}', leg + " slowdown"),
            (f"gpu_memory_temperature_celsius{{{g}}}", leg + " HBM"),
            (f'gpu_temperature_threshold_celsius{{{g}, threshold="memory_max"}}', leg + " HBM limit")],
           "celsius", "GPU against its slowdown threshold, HBM against its own maximum.", lost_of=g),
        12, 8,
    )  # fmt: skip
    lay.add(
        ts("Power and limit",
           [(f"gpu_power_usage_watts{{{g}}}", leg), (f"gpu_power_limit_watts{{{g}}}", leg + " limit")], "watt",
           lost_of=g),
        12, 8,
    )  # fmt: skip
    lay.add(
        ts("SM clock",
           [(f'gpu_clock_hertz{{{g}, clock="sm"}}', leg)],
           "hertz", lost_of=g),
        12, 8,
    )  # fmt: skip
    lay.add(
        ts("Active clock event reasons",
           [(f"count by (reason) (gpu_clock_event_reason_active{{{g}}} == 1)", "{{reason}}"),
            (f'count(max by (gpu) (gpu_clock_event_reason_active{{{g}, reason=~"{THROTTLE}"}}) == 1) or vector(0)',
             "throttled GPUs")],
           "short", "GPUs per active clock event reason (only active ones are drawn); throttled: a power cap, heat or "
           "a hardware signal holds clocks down."),
        12, 8,
    )  # fmt: skip
    lay.add(
        ts("PCIe and NVLink traffic",
           [(f"gpu_pcie_receive_bytes_per_second{{{g}}}", leg + " PCIe RX"),
            (f"gpu_pcie_transmit_bytes_per_second{{{g}}}", leg + " PCIe TX"),
            (f"gpu_nvlink_receive_bytes_per_second{{{g}}}", leg + " NVLink RX"),
            (f"gpu_nvlink_transmit_bytes_per_second{{{g}}}", leg + " NVLink TX")],
           "Bps", "NVLink series exist on GPUs with NVLink only.", lost_of=g),
        12, 8,
    )  # fmt: skip
    lay.add(
        ts("PCIe link width",
           [(f"gpu_pcie_link_width{{{g}}}", leg), (f"gpu_pcie_link_max_width{{{g}}}", leg + " max")], "short",
           "Lanes in use against the maximum: fewer is a degraded link (GpuPcieLinkDegraded)."),
        12, 8,
    )  # fmt: skip
    lay.add(
        ts("Errors",
           [(f"round(sum by (gpu, xid) (increase(gpu_xid_errors_total{{{g}}}[$__rate_interval]))) > 0",
             leg + " XID {{xid}}"),
            (f'round(increase(gpu_ecc_errors_total{{{g}, type="uncorrected", counter="volatile"}}[$__rate_interval]))'
             " > 0", leg + " uncorrectable ECC"),
            (f"round(sum by (gpu) (increase(gpu_nvlink_errors_total{{{g}}}[$__rate_interval]))) > 0",
             leg + " NVLink CRC"),
            (f"round(sum(increase(gpu_xid_errors_total{{{g}}}[$__rate_interval])) or vector(0))", "all XIDs")],
           "short", "Errors per interval; only the GPUs and codes that had one are drawn."),
        12, 8,
    )  # fmt: skip
    lay.add(
        timeline("Row remapping",
                 [(f"gpu_row_remap_pending{{{g}}}", leg + " pending"),
                  (f"gpu_row_remap_failure{{{g}}}", leg + " failed")],
                 "bool_yes_no"),
        12, 8,
    )  # fmt: skip
    lay.add(
        tbl("Processes on this node",
            [(f"gpu_process_memory_used_bytes{{{sel}}} * on (instance, gpu, uuid, pid) group_left (job_id, job_kind, "
              f"user) gpu_process_job_info{{{sel}}}", "")],
            "bytes", "Every GPU process of the node with its job and the GPU memory it holds (the largest processes "
            "of each GPU).", links=[job_link()], rename={"Value": "GPU memory"}),
        24, 8,
    )  # fmt: skip
    return dashboard(
        "gpuwarden-node", "GPU node (gpuwarden)", "One node's GPUs: verdicts, readings against limits, processes.",
        [var_ds(), *cluster_and_job(),
         var("instance", f"label_values(gpu_up{{{BY_CLUSTER}}}, instance)", multi=False),
         var("gpu", f'label_values(gpu_up{{{BY_CLUSTER}, instance="$instance"}}, gpu)')],
        lay,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------------------ job


def job() -> gd.Dashboard:
    """Job view: a job's GPUs side by side with its diagnosis and processes."""
    # a cluster-wide id (pod UID, Slurm job) is the same job on every node; a node-local one (container, cgroup,
    # systemd unit) repeats on unrelated nodes, so only the chosen node's is this job
    info = (
        '(gpu_process_job_info{job=~"$job", job_id="$job_id", job_scope="cluster"}'
        ' or gpu_process_job_info{job=~"$job", job_id="$job_id", job_scope!="cluster", instance="$instance"})'
    )
    gpus = f"max by (instance, gpu, uuid) ({info})"
    on = "* on (instance, gpu, uuid) group_left ()"
    leg = "{{instance}} GPU {{gpu}}"
    lay = Layout()
    lay.add(st("GPUs", [(f"count({gpus})", "GPUs")], "short", NEUTRAL, "GPUs the job's processes use."), 4, 4)
    lay.add(st("Nodes", [(f"count(count by (instance) ({info}))", "nodes")], "short", NEUTRAL), 4, 4)
    lay.add(
        st("Starved (mean of the job's GPUs)", [(f"avg(gpu_starved_ratio {on} {gpus})", "starved")], "percentunit",
           steps((None, GREEN), (0.2, "orange"), (0.5, RED)), "Share of the window the job's GPUs waited."),
        8, 4,
    )  # fmt: skip
    lay.add(
        st("Imbalance across the job's GPUs",
           [('job_id:gpu_imbalance_ratio:across_nodes{job_id="$job_id"}'
             f' or max(gpu_job_imbalance_ratio{{job=~"$job", job_id="$job_id"}} and on (instance) {gpus})'
             f" or max(0 * (count by (instance) ({gpus}) == 1))", "imbalance")],
           "percentunit", steps((None, GREEN), (0.2, "orange"), (0.5, RED)),
           "(1 - mean/max) * n/(n-1) of 5-minute SM activity: 0 balanced, 1 one GPU does all the work; 0 for a job "
           "with one GPU a node and no cluster-wide id."),
        8, 4,
    )  # fmt: skip
    lay.add(ts("SM activity of the job's GPUs", [(f"gpu_sm_activity_ratio {on} {gpus}", leg)], "percentunit",
               min=0, max=1), 12, 8)  # fmt: skip
    lay.add(
        ts("util.gpu of the job's GPUs", [(f"gpu_utilization_ratio {on} {gpus}", leg)], "percentunit",
           "util.gpu near 100% with low SM activity: the GPU spins (waits on peers) or runs tiny kernels.",
           min=0, max=1),
        12, 8,
    )  # fmt: skip
    lay.add(ts("Starved ratio of the job's GPUs", [(f"gpu_starved_ratio {on} {gpus}", leg)], "percentunit", min=0,
               max=1), 12, 8)  # fmt: skip
    lay.add(
        ts("Imbalance of the job by node",
           [(f'max by (instance) (gpu_job_imbalance_ratio{{job=~"$job", job_id="$job_id"}} and on (instance) {gpus})',
             "{{instance}}"),
            (f"0 * (count by (instance) ({gpus}) == 1)", "{{instance}}: one GPU, nothing to balance")],
           "percentunit", "The exporter's gpu_job_imbalance_ratio of the job's GPUs on each node.", min=0, max=1),
        12, 8,
    )  # fmt: skip
    lay.add(
        tbl("Diagnosis of the job's GPUs", [(f"(gpu_diagnosis == 1) {on} {gpus}", "")], "short",
            "The verdict and findings of each GPU (docs/scores.md). `gpuwarden diagnose` on the node names the "
            "remedies.", links=[node_link()]),
        24, 8,
    )  # fmt: skip
    lay.add(ts("GPU memory of the job's GPUs", [(f"gpu_memory_used_bytes {on} {gpus}", leg)], "bytes"), 12, 8)
    lay.add(
        ts("Throttled GPUs of the job",
           [(f'count((max by (instance, gpu, uuid) (gpu_clock_event_reason_active{{reason=~"{THROTTLE}"}}) == 1)'
             f" {on} {gpus}) or vector(0)", "throttled GPUs")],
           "short", "The job's GPUs whose clocks a power cap, heat or a hardware signal holds down."),
        12, 8,
    )  # fmt: skip
    # each GPU set against its job's: the outlier alerts' conditions (GpuHotterThanItsJob, GpuThrottledAloneInJob),
    # the GPU past the line drawn red
    lay.add(
        ts("Temperature above the job's median, each GPU",
           [(f"gpu_temperature_celsius {on} {gpus} - scalar(quantile(0.5, gpu_temperature_celsius {on} {gpus}))",
             leg)],
           "celsius", f"Each GPU's temperature less the median of the job's GPUs, which run the same code: a GPU "
           f"{ALERT_PARAMS['outlier_temperature_celsius']} °C above it for 10 minutes is GpuHotterThanItsJob (red).",
           limits=steps((None, GREEN), (float(ALERT_PARAMS["outlier_temperature_celsius"]), RED)), mark=True),
        12, 8,
    )  # fmt: skip
    lay.add(
        ts("Clocks held down, each GPU",
           [(f'max by (instance, gpu, uuid) (rate(gpu_clock_event_reason_seconds_total{{job=~"$job", '
             f'reason=~"{"|".join(CONDITION_REASONS)}"}}[$__rate_interval])) {on} {gpus}'
             # a reason's counter appears once it counted: a GPU read (gpu_up) without one was never held down
             f" or 0 * max by (instance, gpu, uuid) (gpu_up {on} {gpus})", leg)],
           "percentunit",
           "The largest share of the time one thermal or hardware clock event reason (not the power cap: the "
           "workload's) was active: a GPU at "
           "half or more while its peers are not is GpuThrottledAloneInJob (red), and the job runs at its pace.",
           limits=steps((None, GREEN), (0.5, RED)), mark=True, min=0, max=1),
        12, 8,
    )  # fmt: skip
    lay.add(
        tbl("Processes of the job",
            [(f"gpu_process_memory_used_bytes * on (instance, gpu, uuid, pid) group_left (job_id, job_kind, user) "
              f"{info}", "")],
            "bytes", "Each process of the job, its GPU and the GPU memory it holds.", links=[node_link()],
            rename={"Value": "GPU memory"}),
        24, 8,
    )  # fmt: skip
    return dashboard(
        "gpuwarden-job", "GPU job (gpuwarden)", "One job's GPUs on every node: activity, starvation, imbalance.",
        [var_ds(), *cluster_and_job(), slurm_job_var(),
         var("job_id", f'label_values(gpu_process_job_info{{{BY_CLUSTER}, slurm_job_id=~"$slurm_job_id"}}, job_id)',
             multi=False),
         var("instance", f'label_values(gpu_process_job_info{{{BY_CLUSTER}, job_id="$job_id"}}, instance)',
             multi=False)],
        lay,
    )  # fmt: skip


def render(d: gd.Dashboard) -> str:
    """The dashboard's JSON, keys sorted (stable diffs)."""
    return json.dumps(json.loads(JSONEncoder().encode(d.build())), indent=2, sort_keys=True) + "\n"


#: Every dashboard: its file's name part and the function that builds it.
BOARDS = (("fleet", fleet), ("node", node), ("job", job))


def main() -> None:
    """Write every dashboard."""
    for name, build in BOARDS:
        (OUT / f"gpuwarden-{name}.json").write_text(render(build()))


if __name__ == "__main__":
    main()

"""Generates the Grafana dashboards (classic JSON model) of dashboards/*.json.

Run ``python3 dashboards/generate.py`` after editing; tests/test_dashboards.py checks the JSON files are what
this script writes, and lints them (units, $__rate_interval, no Angular panels, variables, links).
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'job=~"$job", instance=~"$instance"'
GSEL = SEL + ', gpu=~"$gpu"'
LINKS = [
    {"title": "GPU fleet", "type": "link", "url": "/d/gpuwarden-fleet", "keepTime": True, "includeVars": False},
    {"title": "GPU node", "type": "link", "url": "/d/gpuwarden-node", "keepTime": True, "includeVars": True},
    {"title": "GPU job", "type": "link", "url": "/d/gpuwarden-job", "keepTime": True, "includeVars": True},
]


def var_ds() -> dict:
    """The datasource variable."""
    return {
        "name": "datasource",
        "type": "datasource",
        "query": "prometheus",
        "label": "Data source",
        "current": {},
        "hide": 0,
    }


def var(name: str, query: str, multi: bool = True, include_all: bool = True) -> dict:
    """A query variable over label values.

    Without "All" and multi-value, Grafana inserts the value string-escaped, not regex-escaped: such a variable is
    used with ``=``, the others with ``=~``.
    """
    return {
        "name": name,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "includeAll": include_all,
        "multi": multi,
        **({"allValue": ".*"} if include_all else {}),
        "current": {},
        "hide": 0,
        "sort": 1,
    }


def panel(
    pid: int,
    title: str,
    exprs: list[tuple[str, str]],
    unit: str,
    x: int,
    y: int,
    w: int = 12,
    h: int = 8,
    kind: str = "timeseries",
    desc: str = "",
    extra: dict | None = None,
) -> dict:
    """One panel with its queries (expr, legend) and unit."""
    p = {
        "id": pid,
        "type": kind,
        "title": title,
        "description": desc,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
        "targets": [
            {"refId": chr(65 + i), "expr": e, "legendFormat": lg, "datasource": DS} for i, (e, lg) in enumerate(exprs)
        ],
    }
    if kind == "table":
        p["targets"] = [dict(t, format="table", instant=True) for t in p["targets"]]
    if extra:
        p.update(extra)
    return p


def dashboard(uid: str, title: str, variables: list[dict], panels: list[dict]) -> dict:
    """A whole dashboard."""
    return {
        "uid": uid,
        "title": title,
        "tags": ["gpuwarden", "gpu"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "timezone": "browser",
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": variables},
        "links": LINKS,
        "panels": panels,
        "annotations": {"list": []},
    }


def job_link(title: str = "Job view") -> dict:
    """A data link from a row with a job_id to the job view."""
    return {"title": title, "url": "/d/gpuwarden-job?var-job_id=${__data.fields.job_id}&${__url_time_range}"}


def node_link() -> dict:
    """A data link from a row with an instance to the node view."""
    return {
        "title": "Node view",
        "url": "/d/gpuwarden-node?var-job=${__data.fields.job}&var-instance=${__data.fields.instance}"
        "&${__url_time_range}",
    }


def with_links(p: dict, *links: dict) -> dict:
    """Add data links to a panel's fields."""
    p["fieldConfig"]["defaults"]["links"] = list(links)
    return p


RED_ABOVE_90 = {
    "thresholds": {"mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "red", "value": 0.9}]},
    "custom": {"thresholdsStyle": {"mode": "line"}},
}
RED_BELOW_10 = {
    "thresholds": {"mode": "absolute", "steps": [{"color": "red", "value": None}, {"color": "green", "value": 0.1}]},
    "custom": {"thresholdsStyle": {"mode": "line"}},
}
THROTTLE = "sw_power_cap|hw_slowdown|sw_thermal_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown"


def fleet() -> dict:
    """Fleet overview: states, starved GPU-hours, worst jobs, throttling, headroom, health."""
    v = [
        var_ds(),
        var("job", "label_values(gpu_up, job)"),
        var("instance", 'label_values(gpu_up{job=~"$job"}, instance)'),
    ]
    return dashboard(
        "gpuwarden-fleet",
        "GPU fleet (gpuwarden)",
        v,
        [
            panel(
                1,
                "GPUs by state",
                [(f"sum by (state) (rate(gpu_state_seconds_total{{{SEL}}}[$__rate_interval]))", "{{state}}")],
                "short",
                0,
                0,
                desc="GPU-seconds per second in each state (busy, starved, held_idle, free, unknown): a number of "
                "GPUs. States: docs/scores.md.",
                extra={
                    "fieldConfig": {
                        "defaults": {"unit": "short", "custom": {"stacking": {"mode": "normal"}, "fillOpacity": 60}},
                        "overrides": [],
                    }
                },
            ),
            panel(
                2,
                "Starved GPU-hours in range",
                [(f'sum(increase(gpu_state_seconds_total{{{SEL}, state="starved"}}[$__range])) / 3600', "GPU-hours")],
                "h",
                12,
                0,
                w=4,
                kind="stat",
                desc="GPU time spent idle while the job holding the GPU worked (waiting on input, CPU, peers).",
            ),
            panel(
                3,
                "Busy ratio in range",
                [
                    (
                        f'sum(increase(gpu_state_seconds_total{{{SEL}, state="busy"}}[$__range])) / '
                        f"sum(increase(gpu_state_seconds_total{{{SEL}}}[$__range]))",
                        "busy",
                    )
                ],
                "percentunit",
                16,
                0,
                w=4,
                kind="stat",
                desc="Share of the accounted GPU time in which a kernel ran.",
            ),
            panel(
                4,
                "Fleet SM activity",
                [
                    (f"avg(gpu_sm_activity_ratio{{{SEL}}})", "SM activity"),
                    (f"avg(gpu_utilization_ratio{{{SEL}}})", "util.gpu"),
                ],
                "percentunit",
                20,
                0,
                w=4,
                kind="stat",
                desc="util.gpu says a kernel ran; SM activity says how much of the GPU it used (GPM, H100 and later).",
            ),
            with_links(
                panel(
                    5,
                    "Most starved jobs",
                    [("topk(10, job_id:gpu_starved_ratio:avg)", "")],
                    "percentunit",
                    0,
                    8,
                    w=8,
                    kind="table",
                    desc="Mean starved ratio of each job's GPUs, all nodes (recording rule; not filtered by job or "
                    "instance).",
                ),
                job_link(),
            ),
            with_links(
                panel(
                    6,
                    "Most imbalanced jobs",
                    [(
                        "topk(10, job_id:gpu_imbalance_ratio:across_nodes"
                        " or max by (instance, job_id) (gpu_job_imbalance_ratio))",
                        "",
                    )],
                    "percentunit",
                    8,
                    8,
                    w=8,
                    kind="table",
                    desc="(1 - mean/max) * n/(n-1) of the SM activity of each job's GPUs on all nodes: 0 balanced, "
                    "1 one GPU does all the work (recording rule).",
                ),
                job_link(),
            ),
            with_links(
                panel(
                    7,
                    "Most starved GPUs",
                    [(f"topk(10, gpu_starved_ratio{{{SEL}}})", "")],
                    "percentunit",
                    16,
                    8,
                    w=8,
                    kind="table",
                ),
                node_link(),
            ),
            panel(
                8,
                "Throttled GPUs by reason",
                [(f'sum by (reason) (gpu_clock_event_reason_active{{{SEL}, reason=~"{THROTTLE}"}})', "{{reason}}")],
                "short",
                0,
                16,
                desc="Number of GPUs whose clocks a power cap, heat, or a hardware signal holds down.",
            ),
            panel(
                9,
                "Memory headroom of the fullest GPU per node",
                [
                    (
                        f"min by (instance) (gpu_memory_free_bytes{{{SEL}}} / gpu_memory_total_bytes{{{SEL}}})",
                        "{{instance}}",
                    )
                ],
                "percentunit",
                12,
                16,
                desc="GpuMemoryAlmostFull pages below 10%.",
                extra={
                    "fieldConfig": {
                        "defaults": {"unit": "percentunit", "min": 0, "max": 1, **RED_BELOW_10},
                        "overrides": [],
                    }
                },  # fmt: skip
            ),
            panel(
                10,
                "GPUs down",
                [(f"count(gpu_up{{{SEL}}} == 0) or vector(0)", "down")],
                "short",
                0,
                24,
                w=4,
                kind="stat",
            ),
            panel(
                11,
                "GPU health",
                [
                    (
                        f'sum(increase(gpu_ecc_errors_total{{{SEL}, type="uncorrected", counter="volatile"}}'
                        "[$__range]))",
                        "uncorrectable ECC errors",
                    ),
                    (f"count(gpu_row_remap_pending{{{SEL}}} == 1) or vector(0)", "row remap pending"),
                    (f"count(gpu_row_remap_failure{{{SEL}}} == 1) or vector(0)", "row remap failed"),
                ],
                "short",
                4,
                24,
                w=8,
                kind="stat",
                desc="Uncorrectable ECC errors in the range; GPUs waiting for a reset to remap rows; GPUs out of "
                "spare rows (RMA).",
            ),
            panel(
                12,
                "XID errors",
                [
                    (
                        f"sum by (instance, gpu, xid) (increase(gpu_xid_errors_total{{{SEL}}}[$__rate_interval]))",
                        "{{instance}} GPU {{gpu}} XID {{xid}}",
                    )
                ],
                "short",
                12,
                24,
                desc="Critical codes (48, 63, 64, 74, 79, 92, 94, 95, 119, 120) are exported at 0 from the start.",
            ),
            panel(
                13,
                "NVML readable",
                [(f"gpuwarden_source_up{{{SEL}}}", "{{instance}}")],
                "bool_yes_no",
                0,
                32,
                kind="state-timeline",
            ),
            panel(
                14,
                "Age of the last successful poll",
                [(f"time() - gpuwarden_last_poll_success_timestamp_seconds{{{SEL}}}", "{{instance}}")],
                "s",
                12,
                32,
                desc="GpuwardenCollectionStale warns above 10 poll intervals (at least 60 s).",
            ),
        ],
    )


def node() -> dict:
    """Node view: every GPU's time series."""
    v = [
        var_ds(),
        var("job", "label_values(gpu_up, job)"),
        var("instance", 'label_values(gpu_up{job=~"$job"}, instance)', multi=False),
        var("gpu", 'label_values(gpu_up{job=~"$job", instance=~"$instance"}, gpu)'),
    ]
    leg = "GPU {{gpu}}"
    return dashboard(
        "gpuwarden-node",
        "GPU node (gpuwarden)",
        v,
        [
            panel(
                1,
                "Utilization vs SM activity",
                [
                    (f"gpu_utilization_ratio{{{GSEL}}}", leg + " util.gpu"),
                    (f"gpu_sm_activity_ratio{{{GSEL}}}", leg + " SM activity"),
                ],
                "percentunit",
                0,
                0,
            ),
            panel(
                2,
                "Tensor and DRAM activity",
                [
                    (f"gpu_tensor_activity_ratio{{{GSEL}}}", leg + " tensor"),
                    (f"gpu_dram_activity_ratio{{{GSEL}}}", leg + " DRAM"),
                ],
                "percentunit",
                12,
                0,
            ),
            panel(
                3,
                "Memory used",
                [(f"gpu_memory_used_bytes{{{GSEL}}} / gpu_memory_total_bytes{{{GSEL}}}", leg)],
                "percentunit",
                0,
                8,
                desc="GpuMemoryAlmostFull pages above 90% (the red line).",
                extra={
                    "fieldConfig": {
                        "defaults": {"unit": "percentunit", "min": 0, "max": 1, **RED_ABOVE_90},
                        "overrides": [],
                    }
                },  # fmt: skip
            ),
            panel(
                4,
                "Temperature and slowdown threshold",
                [
                    (f"gpu_temperature_celsius{{{GSEL}}}", leg),
                    (f'gpu_temperature_threshold_celsius{{{GSEL}, threshold="slowdown"}}', leg + " slowdown"),
                    (f"gpu_memory_temperature_celsius{{{GSEL}}}", leg + " memory"),
                ],
                "celsius",
                12,
                8,
            ),
            panel(
                5,
                "Power and limit",
                [(f"gpu_power_usage_watts{{{GSEL}}}", leg), (f"gpu_power_limit_watts{{{GSEL}}}", leg + " limit")],
                "watt",
                0,
                16,
            ),
            panel(6, "SM clock", [(f'gpu_clock_hertz{{{GSEL}, clock="sm"}}', leg)], "hertz", 12, 16),
            panel(
                7,
                "Clock event reasons",
                [(f'gpu_clock_event_reason_active{{{GSEL}, reason=~"{THROTTLE}"}}', leg + " {{reason}}")],
                "bool_on_off",
                0,
                24,
                kind="state-timeline",
            ),
            panel(
                8,
                "PCIe traffic",
                [
                    (f"gpu_pcie_receive_bytes_per_second{{{GSEL}}}", leg + " RX"),
                    (f"gpu_pcie_transmit_bytes_per_second{{{GSEL}}}", leg + " TX"),
                ],
                "Bps",
                12,
                24,
            ),
            panel(
                9,
                "State of each GPU",
                [
                    (
                        f"sum by (gpu, state) (rate(gpu_state_seconds_total{{{GSEL}}}[$__rate_interval]))",
                        leg + " {{state}}",
                    )
                ],
                "percentunit",
                0,
                32,
            ),
            panel(
                10,
                "Diagnosis",
                [(f"gpu_diagnosis{{{GSEL}}} == 1", leg + " {{reason}}")],
                "bool_on_off",
                12,
                32,
                kind="state-timeline",
                desc="The verdict of each GPU and the extra findings (docs/scores.md); `gpuwarden diagnose` explains.",
            ),
            panel(
                11,
                "XID and uncorrectable ECC errors",
                [
                    (
                        f"increase(gpu_xid_errors_total{{{GSEL}}}[$__rate_interval])",
                        leg + " XID {{xid}}",
                    ),
                    (
                        f'increase(gpu_ecc_errors_total{{{GSEL}, type="uncorrected", counter="volatile"}}'
                        "[$__rate_interval])",
                        leg + " uncorrectable ECC",
                    ),
                ],
                "short",
                0,
                40,
            ),
            panel(
                12,
                "Row remapping",
                [
                    (f"gpu_row_remap_pending{{{GSEL}}}", leg + " pending"),
                    (f"gpu_row_remap_failure{{{GSEL}}}", leg + " failed"),
                ],
                "bool_yes_no",
                12,
                40,
                kind="state-timeline",
            ),
        ],
    )


def job() -> dict:
    """Job view: a job's GPUs side by side with its diagnosis."""
    v = [
        var_ds(),
        var("job", "label_values(gpu_up, job)"),
        var("job_id", 'label_values(gpu_process_job_info{job=~"$job"}, job_id)', multi=False, include_all=False),
    ]
    jobgpus = 'max by (instance, gpu, uuid) (gpu_process_job_info{job=~"$job", job_id="$job_id"})'
    on = "* on (instance, gpu, uuid) group_left ()"
    leg = "{{instance}} GPU {{gpu}}"
    return dashboard(
        "gpuwarden-job",
        "GPU job (gpuwarden)",
        v,
        [
            panel(1, "GPUs", [('job_id:gpus:count{job_id="$job_id"}', "GPUs")], "short", 0, 0, w=4, h=4, kind="stat"),
            panel(
                2,
                "Nodes",
                [(
                    'job_id:gpu_nodes:count{job_id="$job_id"}'
                    ' or count(count by (instance) (gpu_process_job_info{job=~"$job", job_id="$job_id"}))',
                    "nodes",
                )],
                "short",
                4,
                0,
                w=4,
                h=4,
                kind="stat",
            ),  # fmt: skip
            panel(
                3,
                "Starved (mean of the job's GPUs)",
                [('job_id:gpu_starved_ratio:avg{job_id="$job_id"}', "starved")],
                "percentunit",
                8,
                0,
                w=8,
                h=4,
                kind="stat",
            ),
            panel(
                4,
                "Imbalance across all the job's GPUs",
                [(
                    'job_id:gpu_imbalance_ratio:across_nodes{job_id="$job_id"}'
                    ' or max by (instance, job_id) (gpu_job_imbalance_ratio{job_id="$job_id"})',
                    "imbalance",
                )],
                "percentunit",
                16,
                0,
                w=8,
                h=4,
                kind="stat",
                desc="(1 - mean/max) * n/(n-1) of 5-minute SM activity: 0 balanced, 1 one GPU does all the work.",
            ),
            panel(
                5,
                "SM activity of the job's GPUs",
                [(f"gpu_sm_activity_ratio {on} {jobgpus}", leg)],
                "percentunit",
                0,
                4,
            ),
            panel(
                6,
                "util.gpu of the job's GPUs",
                [(f"gpu_utilization_ratio {on} {jobgpus}", leg)],
                "percentunit",
                12,
                4,
                desc="util.gpu near 100% with low SM activity: the GPU spins (waits on peers) or runs tiny kernels.",
            ),
            panel(
                7,
                "Imbalance of the job",
                [
                    ('max by (instance) (gpu_job_imbalance_ratio{job=~"$job", job_id="$job_id"})', "{{instance}}"),
                    (
                        'job_id:gpu_imbalance_ratio:across_nodes{job_id="$job_id"}'
                        ' or max by (instance, job_id) (gpu_job_imbalance_ratio{job_id="$job_id"})',
                        "all nodes",
                    ),
                ],
                "percentunit",
                0,
                12,
                desc="Per node: the exporter's gpu_job_imbalance_ratio. All nodes: the recording rule.",
            ),
            panel(
                8,
                "Starved ratio of the job's GPUs",
                [(f"gpu_starved_ratio {on} {jobgpus}", leg)],
                "percentunit",
                12,
                12,
            ),
            with_links(
                panel(
                    9,
                    "Diagnosis of the job's GPUs",
                    [(f"(gpu_diagnosis == 1) {on} {jobgpus}", leg + " {{reason}}")],
                    "short",
                    0,
                    20,
                    w=24,
                    kind="table",
                    desc="The verdict and findings of each GPU (docs/scores.md). `gpuwarden diagnose` on the node "
                    "names the remedies.",
                ),
                node_link(),
            ),
            panel(
                10,
                "GPU memory of the job's GPUs",
                [(f"gpu_memory_used_bytes {on} {jobgpus}", leg)],
                "bytes",
                0,
                28,
            ),
            panel(
                11,
                "Clock event reasons of the job's GPUs",
                [(f'gpu_clock_event_reason_active{{reason=~"{THROTTLE}"}} {on} {jobgpus}', leg + " {{reason}}")],
                "bool_on_off",
                12,
                28,
                kind="state-timeline",
            ),
            panel(
                12,
                "Processes of the job",
                [('gpu_process_job_info{job=~"$job", job_id="$job_id"}', "")],
                "short",
                0,
                36,
                w=24,
                kind="table",
            ),
        ],
    )


def main() -> None:
    """Write every dashboard."""
    for name, d in (("fleet", fleet()), ("node", node()), ("job", job())):
        (HERE / f"gpuwarden-{name}.json").write_text(json.dumps(d, indent=2) + "\n")


if __name__ == "__main__":
    main()

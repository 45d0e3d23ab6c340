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


def var(name: str, query: str, multi: bool = True) -> dict:
    """A query variable over label values."""
    return {
        "name": name,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": multi,
        "allValue": ".*",
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
                desc="GPU-seconds per second in each state (busy, starved, held_idle, free): the number of GPUs.",
                extra={
                    "fieldConfig": {
                        "defaults": {"unit": "short", "custom": {"stacking": {"mode": "normal"}}},
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
                w=6,
                kind="stat",
            ),
            panel(
                3,
                "Fleet SM activity",
                [
                    (f"avg(gpu_sm_activity_ratio{{{SEL}}})", "SM activity"),
                    (f"avg(gpu_utilization_ratio{{{SEL}}})", "util.gpu"),
                ],
                "percentunit",
                18,
                0,
                w=6,
                kind="stat",
            ),
            panel(
                4,
                "Most starved GPUs",
                [(f"topk(10, gpu_starved_ratio{{{SEL}}})", "")],
                "percentunit",
                0,
                8,
                kind="table",
            ),
            panel(
                5,
                "Most imbalanced jobs",
                [(f"topk(10, gpu_job_imbalance_ratio{{{SEL}}})", "")],
                "percentunit",
                12,
                8,
                kind="table",
            ),
            panel(
                6,
                "Throttled GPUs by reason",
                [(f'sum by (reason) (gpu_clock_event_reason_active{{{SEL}, reason!="gpu_idle"}})', "{{reason}}")],
                "short",
                0,
                16,
            ),
            panel(
                7,
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
            ),
            panel(
                8,
                "GPUs down",
                [(f"count(gpu_up{{{SEL}}} == 0) or vector(0)", "down")],
                "short",
                0,
                24,
                w=6,
                kind="stat",
            ),
            panel(
                9,
                "XID errors",
                [
                    (
                        f"sum by (instance, gpu, xid) (increase(gpu_xid_errors_total{{{SEL}}}[$__rate_interval]))",
                        "{{instance}} GPU {{gpu}} XID {{xid}}",
                    )
                ],
                "short",
                6,
                24,
                w=9,
            ),
            panel(
                10,
                "Exporter health",
                [
                    (f"gpuwarden_source_up{{{SEL}}}", "{{instance}} NVML up"),
                    (f"time() - gpuwarden_last_poll_success_timestamp_seconds{{{SEL}}}", "{{instance}} last poll age"),
                ],
                "short",
                15,
                24,
                w=9,
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
            panel(3, "Memory used", [(f"gpu_memory_used_bytes{{{GSEL}}}", leg)], "bytes", 0, 8),
            panel(
                4,
                "Temperature and slowdown threshold",
                [
                    (f"gpu_temperature_celsius{{{GSEL}}}", leg),
                    (f'gpu_temperature_threshold_celsius{{{GSEL}, threshold="slowdown"}}', leg + " slowdown"),
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
                [(f'gpu_clock_event_reason_active{{{GSEL}, reason!="gpu_idle"}}', leg + " {{reason}}")],
                "short",
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
                "short",
                12,
                32,
                kind="state-timeline",
            ),
        ],
    )


def job() -> dict:
    """Job view: a job's GPUs side by side with its diagnosis."""
    v = [
        var_ds(),
        var("job", "label_values(gpu_up, job)"),
        var("job_id", 'label_values(gpu_process_job_info{job=~"$job"}, job_id)', multi=False),
    ]
    jobgpus = 'max by (instance, gpu, uuid) (gpu_process_job_info{job=~"$job", job_id="$job_id"})'
    leg = "{{instance}} GPU {{gpu}}"
    return dashboard(
        "gpuwarden-job",
        "GPU job (gpuwarden)",
        v,
        [
            panel(
                1,
                "SM activity of the job's GPUs",
                [(f"gpu_sm_activity_ratio * on (instance, gpu, uuid) {jobgpus}", leg)],
                "percentunit",
                0,
                0,
            ),
            panel(
                2,
                "util.gpu of the job's GPUs",
                [(f"gpu_utilization_ratio * on (instance, gpu, uuid) {jobgpus}", leg)],
                "percentunit",
                12,
                0,
            ),
            panel(
                3,
                "Imbalance of the job",
                [
                    ('max(gpu_job_imbalance_ratio{job=~"$job", job_id="$job_id"})', "on one node"),
                    ('job_id:gpu_imbalance_ratio:across_nodes{job_id="$job_id"}', "across nodes"),
                ],
                "percentunit",
                0,
                8,
            ),
            panel(
                4,
                "Starved ratio of the job's GPUs",
                [(f"gpu_starved_ratio * on (instance, gpu, uuid) {jobgpus}", leg)],
                "percentunit",
                12,
                8,
            ),
            panel(
                5,
                "Diagnosis of the job's GPUs",
                [(f"(gpu_diagnosis == 1) * on (instance, gpu, uuid) {jobgpus}", leg + " {{reason}}")],
                "short",
                0,
                16,
                w=24,
                kind="table",
            ),
            panel(
                6,
                "GPU memory of the job's GPUs",
                [(f"gpu_memory_used_bytes * on (instance, gpu, uuid) {jobgpus}", leg)],
                "bytes",
                0,
                24,
            ),
            panel(
                7,
                "Processes of the job",
                [('gpu_process_job_info{job=~"$job", job_id="$job_id"}', "")],
                "short",
                12,
                24,
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

"""Lint of the Grafana dashboards: generated, classic JSON model, units, variables, rates, links."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).parent.parent
BOARDS = sorted((REPO / "gpuwarden" / "mixin" / "dashboards").glob("*.json"))


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_three_dashboards_linked_together() -> None:
    uids = {load(p)["uid"] for p in BOARDS}
    assert uids == {"gpuwarden-fleet", "gpuwarden-node", "gpuwarden-job"}
    for p in BOARDS:
        urls = {link["url"] for link in load(p)["links"]}
        assert {f"/d/{u}" for u in uids} <= urls, p.name


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_dashboard_lint(path: Path) -> None:
    d = load(path)
    assert 36 <= d["schemaVersion"] <= 41
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and "job" in variables
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert p["type"] not in ("graph", "singlestat", "table-old"), f"{p['title']}: Angular panel"
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["fieldConfig"]["defaults"].get("unit"), f"{p['title']}: no unit"
        for t in p["targets"]:
            expr = t["expr"]
            for rng in re.findall(r"\[([^\]]+)\]", expr):
                assert rng in ("$__rate_interval", "$__range"), f"{p['title']}: fixed range [{rng}]"
            assert 'job=~"$job"' in expr or "job_id:" in expr, f"{p['title']}: not filtered by $job"


# Grafana unit ids used here (public/app/features/... valueFormats): a typo renders raw numbers.
UNITS = {"short", "percentunit", "h", "s", "bytes", "Bps", "celsius", "watt", "hertz", "bool_yes_no", "bool_on_off"}


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_units_known_and_panels_do_not_overlap(path: Path) -> None:
    panels = load(path)["panels"]
    for p in panels:
        assert p["fieldConfig"]["defaults"]["unit"] in UNITS, p["title"]
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_recording_rules_used_by_dashboards_exist() -> None:
    import yaml

    groups = yaml.safe_load((REPO / "alerts" / "gpuwarden.rules.yml").read_text())["groups"]
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    used = {
        name
        for p in BOARDS
        for panel in load(p)["panels"]
        for t in panel["targets"]
        for name in re.findall(r"[a-z_]*:[a-z_]+:[a-z0-9_]+", t["expr"])
    }
    assert used, "the dashboards use no recording rule"
    assert used <= recorded, used - recorded


def _links(panel: dict) -> list[str]:
    return [link["url"] for link in panel["fieldConfig"]["defaults"].get("links", [])]


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_rows_with_a_job_or_a_node_link_to_its_view_percent_encoded(path: Path) -> None:
    # a job id is a cgroup path or user/command: '/' and '&' must not end the query string
    for p in load(path)["panels"]:
        cols = " ".join(t["expr"] for t in p["targets"])
        rows_are_jobs = "job_id:" in cols or ("gpu_process_job_info" in cols and "$job_id" not in cols)
        if p["type"] == "table" and rows_are_jobs:
            assert (
                "/d/gpuwarden-job?var-job_id=${__data.fields.job_id:percentencode}"
                "&var-instance=${__data.fields.instance:percentencode}&${__url_time_range}"
            ) in _links(p), p["title"]
        for url in _links(p):
            for field in re.findall(r"\$\{__data\.fields\.[a-z_]+(:?\w*)\}", url):
                assert field == ":percentencode", (p["title"], url)


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_every_stat_has_thresholds_and_trouble_is_red_at_one(path: Path) -> None:
    for p in load(path)["panels"]:
        if p["type"] != "stat":
            continue
        th = p["fieldConfig"]["defaults"]["thresholds"]
        assert th["mode"] == "absolute" and th["steps"][0]["value"] is None, p["title"]
        if re.search(r"^GPUs lost|ECC|health|remap|XID|Recovery", p["title"]):
            assert [(s["value"], s["color"]) for s in th["steps"]] == [(None, "green"), (1, "red")], p["title"]


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_tables_hide_time_and_the_metric_name(path: Path) -> None:
    for p in load(path)["panels"]:
        if p["type"] == "table":
            [organize] = [t for t in p["transformations"] if t["id"] == "organize"]
            hidden = {k for k, v in organize["options"]["excludeByName"].items() if v}
            assert {"Time", "__name__", "uuid", "job"} <= hidden, p["title"]
            assert all(t["instant"] and t["format"] == "table" for t in p["targets"]), p["title"]


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_xids_and_clock_reasons_drawn_only_when_non_zero_or_active(path: Path) -> None:
    # a per-GPU series of every XID code (10 per GPU) or every reason (14 per GPU) is noise: 140 rows on 8 GPUs
    for p in load(path)["panels"]:
        for t in p["targets"]:
            e = t["expr"]
            per_gpu = "{{gpu}}" in t.get("legendFormat", "") or p["type"] == "table"
            if per_gpu and ("gpu_xid_errors_total" in e or "gpu_clock_event_reason_active" in e):
                assert re.search(r"(> 0|== 1)\)?$", e) or "count" in e, (p["title"], e)


def test_node_view_shows_one_node_and_its_gpus_model_processes_links_and_lost_gpus() -> None:
    d = load(REPO / "gpuwarden" / "mixin" / "dashboards" / "gpuwarden-node.json")
    inst = next(v for v in d["templating"]["list"] if v["name"] == "instance")
    assert inst["multi"] is False and inst["includeAll"] is False
    exprs = " ".join(t["expr"] for p in d["panels"] for t in p["targets"])
    for metric in ("gpu_info", "gpu_process_memory_used_bytes", "gpu_nvlink_receive_bytes_per_second",
                   "gpu_pcie_link_width", "gpu_pcie_link_max_width", "gpu_nvlink_errors_total",
                   "gpu_recovery_action", "gpu_temperature_threshold_celsius"):  # fmt: skip
        assert metric in exprs, metric
    for p in d["panels"]:
        per_gpu = [t for t in p["targets"] if t.get("legendFormat", "").startswith("GPU {{gpu}}")]
        gauge = r"gpu_(utilization|sm|memory_used|power_usage|temperature_c|clock_h|pcie_r)"
        gauges = [t for t in per_gpu if re.match(gauge, t["expr"])]
        if p["type"] == "timeseries" and gauges:
            assert any(t["expr"].startswith("gpu_up{") and t["expr"].endswith("== 0") for t in p["targets"]), p["title"]
        for t in p["targets"]:
            assert 'instance="$instance"' in t["expr"] or "gpu_process" in t["expr"], (p["title"], t["expr"])


def test_variables_are_matched_the_way_grafana_escapes_them() -> None:
    # regex-escaped ("All" or multi-value) variables with =~, string-escaped ones with =
    for path in BOARDS:
        d = load(path)
        for v in d["templating"]["list"]:
            if v["type"] != "query":
                continue
            regex = v["includeAll"] or v["multi"]
            for p in d["panels"]:
                for t in p["targets"]:
                    for op in re.findall(rf'(=~|!~|=|!=)"\${v["name"]}"', t["expr"]):
                        assert (op in ("=~", "!~")) == regex, f"{path.stem} {p['title']}: {op}${v['name']}"


@pytest.mark.e2e
def test_grafana_provisioning() -> None:
    import yaml

    prov = REPO / "deploy" / "grafana" / "provisioning"
    [ds] = yaml.safe_load((prov / "datasources" / "gpuwarden.yml").read_text())["datasources"]
    assert ds["type"] == "prometheus" and ds["url"].startswith("http")
    # its own name, not the default: it never clashes with (or takes over from) a datasource the Grafana has
    assert ds["name"] == "gpuwarden-prometheus" and ds["isDefault"] is False
    [provider] = yaml.safe_load((prov / "dashboards" / "gpuwarden.yml").read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    # the dashboards choose the datasource by variable, of the provisioned type
    for p in BOARDS:
        ds_var = next(v for v in load(p)["templating"]["list"] if v["name"] == "datasource")
        assert ds_var["query"] == ds["type"]

"""The alert rules: promtool lint and unit tests, and every rule covered by a test and a runbook section."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import generated

REPO = Path(__file__).parent.parent
RULES = [REPO / "alerts" / "gpuwarden.rules.yml"]  # the shipped rules; dcgm-compat.rules.yml is optional, apart
COMPAT = REPO / "gpuwarden" / "mixin" / "dcgm-compat.rules.yml"
TESTS = sorted((REPO / "alerts" / "tests").glob("*.test.yml"))
RUNBOOK = (REPO / "docs" / "runbook.md").read_text()


def rules() -> list[dict]:
    return [r for f in map(generated, RULES) for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]]


@pytest.mark.e2e
def test_promtool_check_rules(promtool: str) -> None:
    res = subprocess.run([promtool, "check", "rules", *map(str, [*RULES, COMPAT])], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.e2e
def test_promtool_test_rules(promtool: str) -> None:
    """Each test file run exactly as its header says: promtool test rules FILE, from alerts/tests. memory.test.yml is
    generated from the memory shapes, and test_memory_shapes.py runs every one of them through promtool on the same
    rules (and checks the committed file is the generator's): not run twice."""
    for f in REPO / "alerts" / "gpuwarden.rules.yml", REPO / "alerts" / "tests" / "bare.rules.yml":
        generated(f)  # what the test files read: the rules as the template and parameters make them now
    for f in (t for t in TESTS if t.name != "memory.test.yml"):
        res = subprocess.run([promtool, "test", "rules", f.name], capture_output=True, text=True, timeout=600,
                             cwd=f.parent)  # fmt: skip
        assert res.returncode == 0, f.name + res.stdout + res.stderr


def _generate() -> object:
    return _module("generate")


def test_parameters_change_thresholds_selectors_and_urls(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    gen = _generate()
    (tmp_path / "p.yml").write_text(
        "selector: 'cluster=\"a\", '\nmemory_full_ratio: 0.95\nrunbook_url: https://wiki.example/gpu\n"
    )
    assert gen.main(["--params", str(tmp_path / "p.yml"), "--out", str(tmp_path / "r.yml")]) == 0  # type: ignore[attr-defined]
    rules = {r["alert"]: r for g in yaml.safe_load((tmp_path / "r.yml").read_text())["groups"] for r in g["rules"]
             if "alert" in r}  # fmt: skip
    mem = rules["GpuMemoryAlmostFull"]
    assert 'gpu_memory_used_bytes{cluster="a", }' in mem["expr"] and "> 0.95" in mem["expr"]
    assert mem["annotations"]["summary"] == "GPU memory is more than 95% used."
    assert mem["annotations"]["runbook_url"] == "https://wiki.example/gpu#gpumemoryalmostfull"
    (tmp_path / "bad.yml").write_text("memory_ful_ratio: 0.95\n")
    assert gen.main(["--params", str(tmp_path / "bad.yml"), "--out", str(tmp_path / "x.yml")]) == 2  # type: ignore[attr-defined]
    assert "unknown parameters memory_ful_ratio" in capsys.readouterr().err and not (tmp_path / "x.yml").exists()


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("runbook_url: docs/runbook.md", "runbook_url must be an absolute http(s) URL"),
        ("grafana_url: /grafana", "grafana_url must be an absolute http(s) URL"),
        ("grafana_url: 'javascript:alert(1)'", "grafana_url must be an absolute http(s) URL"),
        ("cluster_labels: 'cluster, bad-label'", "cluster_labels must be label names"),
        ("memory_interval: 7m", "must be whole multiples of memory_interval (7m)"),
    ],
)
def test_relative_links_and_bad_label_lists_are_refused(tmp_path: Path, capsys, param: str, message: str) -> None:  # noqa: ANN001
    gen = _generate()
    (tmp_path / "p.yml").write_text(param + "\n")
    assert gen.main(["--params", str(tmp_path / "p.yml"), "--out", str(tmp_path / "r.yml")]) == 2  # type: ignore[attr-defined]
    assert message in capsys.readouterr().err and not (tmp_path / "r.yml").exists()


def test_without_a_grafana_url_the_alerts_carry_no_dashboard_link_and_the_generator_says_so(
    tmp_path: Path,
    capsys,  # noqa: ANN001
) -> None:
    gen = _generate()
    assert gen.main(["--out", str(tmp_path / "r.yml")]) == 0  # type: ignore[attr-defined]
    assert "dashboard_url" not in (tmp_path / "r.yml").read_text()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "grafana_url is not set: the alerts carry no dashboard_url" in err
    (tmp_path / "p.yml").write_text("grafana_url: https://grafana.example/\n")
    assert gen.main(["--params", str(tmp_path / "p.yml"), "--out", str(tmp_path / "g.yml")]) == 0  # type: ignore[attr-defined]
    assert capsys.readouterr().err == ""
    rules = {r["alert"]: r for g in yaml.safe_load((tmp_path / "g.yml").read_text())["groups"] for r in g["rules"]
             if "alert" in r}  # fmt: skip
    job = rules["GpuJobImbalanced"]["annotations"]["dashboard_url"]
    # a node-local job id opens that node's job, in its cluster
    assert job.startswith("https://grafana.example/d/gpuwarden-job/gpuwarden-job?var-job_id={{ $labels.job_id")
    assert "&var-instance={{ $labels.instance | urlquery }}&var-cluster={{ $labels.cluster | urlquery }}" in job
    node = rules["GpuLost"]["annotations"]["dashboard_url"]
    assert "var-instance={{ $labels.instance | urlquery }}&var-gpu={{ $labels.gpu | urlquery }}" in node


def test_cluster_labels_are_kept_in_cross_target_aggregations(tmp_path: Path) -> None:
    gen = _generate()
    (tmp_path / "p.yml").write_text("cluster_labels: 'cluster, region'\ngrafana_url: https://grafana.example/\n")
    assert gen.main(["--params", str(tmp_path / "p.yml"), "--out", str(tmp_path / "r.yml")]) == 0  # type: ignore[attr-defined]
    rules = [r for g in yaml.safe_load((tmp_path / "r.yml").read_text())["groups"] for r in g["rules"]]
    by = {r.get("record") or r["alert"]: r["expr"] for r in rules}
    assert "count by (cluster, region, job_id)" in by["job_id:gpu_nodes:count"]
    assert "max by (cluster, region, nodename)" in by["nodename:gpu_devices:max"]
    assert "< on (cluster, region, nodename) group_left ()" in by["GpuMissing"]
    urls = [r["annotations"]["dashboard_url"] for r in rules if "alert" in r]
    assert all(u.startswith("https://grafana.example/d/gpuwarden-") for u in urls), urls


@pytest.mark.e2e
def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for f in TESTS:
        for t in yaml.safe_load(f.read_text())["tests"]:
            assert "interval" in t, f"{t['name']}: promtool 2.42 needs interval in every test group"
            for case in t.get("alert_rule_test", []):
                (fires if case["exp_alerts"] else silent).add(case["alertname"])
    alerts = {r["alert"] for r in rules() if "alert" in r}
    assert alerts - fires == set(), "alerts with no firing test"
    assert alerts - silent == set(), "alerts with no must-not-fire test"


def test_every_recording_rule_is_tested() -> None:
    tested = {c["expr"].strip() for f in TESTS for t in yaml.safe_load(f.read_text())["tests"]
              for c in t.get("promql_expr_test", [])}  # fmt: skip
    records = {r["record"] for r in rules() if "record" in r}
    assert records - tested == set()
    for name in records:
        assert re.fullmatch(r"[a-z_]*:[a-z_]+:[a-z0-9_]+", name), f"{name}: not level:metric:operations"


def test_alerts_follow_the_mixin_style() -> None:
    anchors = {a.lower() for a in re.findall(r"^## (\w+)$", RUNBOOK, re.M)}
    for r in (r for r in rules() if "alert" in r):
        name = r["alert"]
        assert re.fullmatch(r"Gpu[A-Za-z]+", name), name
        assert r["labels"]["severity"] in ("critical", "warning", "info"), name
        ann = r["annotations"]
        assert ann["summary"].endswith(".") and "{{" not in ann["summary"], name
        assert "{{" in ann["description"], name
        anchor = ann["runbook_url"].rsplit("#", 1)[1]
        assert anchor == name.lower() and anchor in anchors, name
        assert "dashboard_url" not in ann, name  # no Grafana is configured by default: no link that opens nothing
        assert ann["runbook_url"].startswith("https://"), name


@pytest.mark.e2e
def test_example_prometheus_config_is_valid(promtool: str, tmp_path: Path) -> None:
    import shutil

    cfg = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    shutil.copy(RULES[0], rules_dir / "gpuwarden.rules.yml")
    cfg["rule_files"] = [str(rules_dir / "gpuwarden.rules.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    res = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


def test_alert_trace_is_what_its_script_writes_and_says_it_is_modified(tmp_path: Path) -> None:
    import gzip
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_alert_trace", REPO / "tests" / "data" / "make_alert_trace.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(tmp_path / "t.jsonl.gz")
    committed = gzip.decompress(mod.OUT.read_bytes())
    assert gzip.decompress((tmp_path / "t.jsonl.gz").read_bytes()) == committed, "run tests/data/make_alert_trace.py"
    header = yaml.safe_load(committed.split(b"\n", 1)[0])  # JSON is YAML
    assert "modified" in header["metadata"] and header["metadata"]["derived_from"].endswith(".jsonl.gz")


def _module(name: str) -> object:
    """The script alerts/NAME.py, imported."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"alerts_{name}", REPO / "alerts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dcgm_compatibility_rules_are_generated_and_read_only_exported_series() -> None:
    """gpuwarden/mixin/dcgm-compat.rules.yml is its script's output, and every gpuwarden series it reads is one the
    exporter declares (a renamed family would leave a dcgm-exporter dashboard silently empty)."""
    from gpuwarden.catalog import FAMILIES

    compat = _module("dcgm_compat")
    assert compat.render() == COMPAT.read_text()  # type: ignore[attr-defined]
    mapped = {**compat.MAPPED, **compat.MAPPED_49}  # type: ignore[attr-defined]
    assert not set(compat.MAPPED) & set(compat.MAPPED_49)  # type: ignore[attr-defined]
    read = set()
    for expr, _ in mapped.values():
        read |= set(re.findall(r"\b(gpu_[a-z_]+)", expr))
    declared = {f.name for f in FAMILIES}
    assert read and read <= declared, read - declared
    # label values the exporter emits: a wrong one (clock="mem" for "memory") leaves a series silently empty
    from gpuwarden.catalog import CLOCK_DOMAINS

    clocks = {c for expr, _ in mapped.values() for c in re.findall(r'clock="([^"]*)"', expr)}
    assert clocks and clocks <= set(CLOCK_DOMAINS), clocks - set(CLOCK_DOMAINS)
    tested = {
        case["expr"]
        for t in yaml.safe_load((REPO / "alerts" / "tests" / "dcgm-compat.test.yml").read_text())["tests"]
        for case in t["promql_expr_test"]
    }
    assert tested <= set(mapped)
    assert len(tested & set(compat.MAPPED)) >= 5 and len(tested & set(compat.MAPPED_49)) >= 5  # type: ignore[attr-defined]


def test_the_runbook_routing_table_lists_every_alert_as_the_rules_and_routes_have_it() -> None:
    """docs/runbook.md's table: every alert once, with the severity, for and keep_firing_for of the rules and the
    receiver the routes give its labels (severity, notify)."""
    rows = re.findall(r"^\| (Gpu\w+) \| (\w+) \| (\w+) \| ([\w-]+) \| ([\w-]+) \| .+ \|$", RUNBOOK, re.M)
    alerts = {r["alert"]: r for r in rules() if "alert" in r}
    assert sorted(name for name, *_ in rows) == sorted(alerts)
    receiver = {"critical": "pager", "warning": "tickets", "info": "chat"}
    for name, severity, recv, for_, keep in rows:
        rule = alerts[name]
        assert severity == rule["labels"]["severity"], name
        expected = "owners" if rule["labels"].get("notify") == "owner" else receiver[severity]
        assert recv == expected, name
        assert for_ == rule.get("for", "-") and keep == rule.get("keep_firing_for", "-"), name


def test_the_usage_records_are_those_top_reads() -> None:
    """``top --source recorded`` (gpuwarden.cluster.usage) reads the records gpuwarden.mixin.rules writes, under the
    same names at the shipped interval, one per lost cause."""
    from gpuwarden.cluster import usage
    from gpuwarden.mixin import rules as gen

    interval = gen.params()["usage_interval"]
    assert interval == usage.RECORDED_INTERVAL
    assert gen.LOST_CAUSES == usage.LOST_CAUSES
    assert {k: v + interval for k, v in gen.USAGE.items()} == usage.RECORDED
    assert gen.USAGE_SHARE + interval == usage.RECORDED_SHARE
    assert {k: v + interval for k, v in gen.USAGE_GPU.items()} == usage.RECORDED_GPU
    assert gen.USAGE_HEARTBEAT == usage.RECORDED_HEARTBEAT
    assert gen.seconds(gen.USAGE_OFFSET) == usage.RECORDED_OFFSET
    records = {r["record"] for r in rules() if "record" in r}
    assert {*usage.RECORDED.values(), *usage.RECORDED_GPU.values(), usage.RECORDED_SHARE,
            usage.RECORDED_HEARTBEAT} <= records  # fmt: skip
    lost = [r for r in rules() if r.get("record") == usage.RECORDED["lost"]]
    assert sorted(r["labels"]["cause"] for r in lost) == sorted(usage.LOST_CAUSES)


def test_a_test_reading_a_generated_file_checks_it_is_fresh(tmp_path: Path) -> None:
    """The rules the promtool tests read are checked against their generator first (helpers.generated): a template
    changed without running tools/generate.py fails the test that reads it, not only test_generated."""
    import helpers

    for f in (*RULES, REPO / "alerts" / "tests" / "bare.rules.yml", REPO / "alerts" / "tests" / "memory.test.yml"):
        assert generated(f) == f
    with pytest.raises(AssertionError, match="not a file tools/generate.py writes"):
        generated(REPO / "docs" / "runbook.md")
    rel = "alerts/tests/bare.rules.yml"
    was = helpers._FRESH[rel]
    try:
        helpers._FRESH[rel] = False  # as the comparison finds a file the template no longer makes
        with pytest.raises(AssertionError, match=r"^alerts/tests/bare.rules.yml is stale: run python3 tools/generate"):
            generated(REPO / rel)
    finally:
        helpers._FRESH[rel] = was

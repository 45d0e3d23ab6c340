"""End to end: a real Prometheus scrapes gpuwarden replaying real traces with the shipped rules loaded; every
dashboard query and recording rule answers, and the on-call alerts reach a webhook through a real Alertmanager.

The alert rules are loaded from a copy in which every ``for:`` is shortened to 5 s and group intervals are
dropped (evaluation every second), so the alerts fire within the test's time; expressions, labels and
annotations are the shipped ones. The alert trace is a real H100 recording with memory and temperature
raised past the thresholds (tests/data/make_alert_trace.py, marked ``modified`` in its header).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

REPO = Path(__file__).parent.parent
TRACES = REPO / "tests" / "data" / "traces"
PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None or ALERTMANAGER is None,
    reason="prometheus / prometheus-alertmanager not installed (CI installs Debian's packages)",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {timeout} s")


class Webhook(BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Webhook.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("e2e")
    procs: list[subprocess.Popen] = []
    hook = HTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    ports = {name: free_port() for name in ("ddp", "hot", "prom", "am")}
    try:
        for name, trace in (("ddp", "h200x2-ddp_straggler"), ("hot", "derived-h100-hot-full")):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "gpuwarden", "serve", "--replay", str(TRACES / f"{trace}.jsonl.gz"),
                 "--web.listen-address", f"127.0.0.1:{ports[name]}", "--log-level", "warning"],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
        rules = yaml.safe_load((REPO / "alerts" / "gpuwarden.rules.yml").read_text())
        for group in rules["groups"]:
            group.pop("interval", None)
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = "5s"
        (tmp / "rules.yml").write_text(yaml.safe_dump(rules))
        (tmp / "am.yml").write_text(yaml.safe_dump({
            "route": {"receiver": "hook", "group_by": ["alertname"], "group_wait": "1s", "group_interval": "1s",
                      "repeat_interval": "1h"},
            "receivers": [{"name": "hook", "webhook_configs": [
                {"url": f"http://127.0.0.1:{hook.server_port}/", "send_resolved": False}]}],
        }))  # fmt: skip
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp / "rules.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ports['am']}"]}]}]},
            "scrape_configs": [
                {"job_name": "gpuwarden", "static_configs": [{"targets": [f"127.0.0.1:{ports['ddp']}"]}]},
                {"job_name": "gpuwarden-hot", "static_configs": [{"targets": [f"127.0.0.1:{ports['hot']}"]}]},
            ],
        }))  # fmt: skip
        procs.append(subprocess.Popen(
            [ALERTMANAGER, f"--config.file={tmp / 'am.yml'}", f"--storage.path={tmp / 'am'}",
             f"--web.listen-address=127.0.0.1:{ports['am']}", "--cluster.listen-address="],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
        procs.append(subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{ports['prom']}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
        prom = f"http://127.0.0.1:{ports['prom']}"
        for url in (
            f"http://127.0.0.1:{ports['ddp']}/healthz",
            f"http://127.0.0.1:{ports['hot']}/healthz",
            f"{prom}/-/ready",
            f"http://127.0.0.1:{ports['am']}/-/ready",
        ):
            wait_http(url)
        time.sleep(20)  # a few scrapes and rule evaluations, so rates and for: have their samples
        yield {"prom": prom, "ddp": f"127.0.0.1:{ports['ddp']}"}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        hook.shutdown()


def query(prom: str, expr: str) -> list[dict]:
    r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def dashboard_targets() -> list[tuple[str, str, str]]:
    out = []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        d = json.loads(path.read_text())
        for p in d["panels"]:
            for t in p["targets"]:
                out.append((path.stem, p["title"], t["expr"]))
    return out


def promql_regex(value: str) -> str:
    """A value regex-escaped inside a PromQL string, as Grafana inserts an "All"/multi-value variable."""
    return re.escape(value).replace("\\", "\\\\")


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's variable substitution for the variables of dashboards/*.json."""
    expr = expr.replace("$__rate_interval", "10s").replace("$__range", "1m")
    return re.sub(r"\$(job_id|job|instance|gpu)\b", lambda m: values[m.group(1)], expr)


def test_every_dashboard_query_returns_data(stack: dict) -> None:
    [job] = query(stack["prom"], 'group by (job_id) (gpu_process_job_info{job="gpuwarden"})')
    job_id = json.dumps(job["metric"]["job_id"])[1:-1]  # job_id has no "All": string-escaped, used with =
    # "All" for every variable, then one value each (a label lost in an aggregation fails the second)
    for values in (
        {"job": ".*", "instance": ".*", "gpu": ".*", "job_id": job_id},
        {"job": "gpuwarden", "instance": promql_regex(stack["ddp"]), "gpu": "1", "job_id": job_id},
    ):
        empty = [
            (d, title, e) for d, title, e in dashboard_targets() if not query(stack["prom"], substitute(e, values))
        ]
        assert not empty, values


def test_every_dashboard_variable_has_values(stack: dict) -> None:
    values = {"job": "gpuwarden", "instance": promql_regex(stack["ddp"])}
    for path in sorted((REPO / "dashboards").glob("*.json")):
        for v in json.loads(path.read_text())["templating"]["list"]:
            if v["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"])
            assert m, v["query"]
            selector = re.sub(r"\$(job|instance)\b", lambda m: values[m.group(1)], m.group(1))
            r = httpx.get(f"{stack['prom']}/api/v1/label/{m.group(2)}/values", params={"match[]": selector}, timeout=10)
            assert r.json()["data"], (path.stem, v["name"], selector)


def test_every_recording_rule_returns_data(stack: dict) -> None:
    rules = yaml.safe_load((REPO / "alerts" / "gpuwarden.rules.yml").read_text())
    names = [r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r]
    assert names
    assert [n for n in names if not query(stack["prom"], n)] == []


def test_on_call_alerts_arrive_through_alertmanager(stack: dict) -> None:
    # the derived hot trace pages; the real DDP straggler recording notifies its imbalance (info), pages nothing
    expected = {("GpuMemoryAlmostFull", "gpuwarden-hot"), ("GpuOverheating", "gpuwarden-hot"),
                ("GpuJobImbalanced", "gpuwarden")}  # fmt: skip
    deadline = time.time() + 60
    seen: set[tuple[str, str]] = set()
    while time.time() < deadline and not expected <= seen:
        seen = {(a["labels"]["alertname"], a["labels"].get("job", "")) for m in Webhook.received for a in m["alerts"]}
        time.sleep(1)
    assert expected <= seen, seen
    alerts = [a for msg in Webhook.received for a in msg["alerts"]]
    [mem] = {a["fingerprint"]: a for a in alerts if a["labels"]["alertname"] == "GpuMemoryAlmostFull"}.values()
    assert mem["labels"]["severity"] == "critical" and mem["labels"]["job"] == "gpuwarden-hot"
    assert mem["labels"]["gpu"] == "0" and mem["annotations"]["runbook_url"].endswith("#gpumemoryalmostfull")
    assert "95%" in mem["annotations"]["description"]
    hot = [a for a in alerts if a["labels"]["alertname"] == "GpuOverheating"]
    assert {a["labels"]["job"] for a in hot} == {"gpuwarden-hot"}
    assert " 87 °C" in hot[0]["annotations"]["description"]  # the H100's slowdown threshold 89 °C - 2
    imb = next(a for a in alerts if a["labels"]["alertname"] == "GpuJobImbalanced")
    assert imb["labels"]["severity"] == "info" and imb["labels"]["job_id"].startswith("/process_api/")
    # nothing above info from the real, unmodified 2xH200 recording
    assert {a["labels"]["severity"] for a in alerts if a["labels"].get("job") == "gpuwarden"} <= {"info"}

"""``gpuwarden serve --demo faults`` fires a page and a ticket within minutes, through what ships and nothing shortened:
the rules and the Alertmanager routes ``gpuwarden mixin --out`` writes with its default parameters, a real Prometheus
scraping the demo every 15 s with deploy/prometheus/prometheus.yml's settings, and a real Alertmanager whose
receivers (pager, tickets, owners, chat) are one local webhook, each at its own path. docs/prometheus.md's walk-through
is this test's sequence of commands."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import REPO, Webhook, alertmanager, daemon, prometheus, stop_all, wait_http, webhook

PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(PROMETHEUS is None or ALERTMANAGER is None, reason="prometheus/alertmanager not installed"),
]


def _alerts(hook: Webhook, receiver: str) -> dict[str, dict]:
    """The firing alerts notified to ``receiver`` so far, by name (the last notification's)."""
    out = {}
    for path, _, body in hook.got:
        if path == receiver:
            out.update({a["labels"]["alertname"]: a for a in body["alerts"] if a["status"] == "firing"})
    return out


def test_the_faults_demo_pages_and_tickets_through_the_shipped_rules_and_routes(tmp_path: Path) -> None:
    assert PROMETHEUS is not None and ALERTMANAGER is not None
    made = subprocess.run([sys.executable, "-m", "gpuwarden", "mixin", "--out", str(tmp_path / "mixin")],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert made.returncode == 0, made.stderr
    routes = yaml.safe_load((tmp_path / "mixin" / "alertmanager" / "alertmanager.yml").read_text())
    shipped = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    with webhook() as hook:
        for r in routes["receivers"]:  # the mixin's routes as written, every receiver this webhook at its own path
            r["webhook_configs"] = [{"url": f"http://127.0.0.1:{hook.port}/{r['name']}", "send_resolved": False}]
        began = time.monotonic()
        with daemon("--demo", "faults") as url, alertmanager(ALERTMANAGER, tmp_path, routes) as am:
            config = {
                "global": shipped["global"],
                "rule_files": [str(tmp_path / "mixin" / "prometheus" / "gpuwarden.rules.yml")],
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am.removeprefix("http://")]}]}]},
                "scrape_configs": [{**shipped["scrape_configs"][0],
                                    "static_configs": [{"targets": [url.removeprefix("http://")]}]}],
            }  # fmt: skip
            server, prom = prometheus(PROMETHEUS, tmp_path, config)
            try:
                wait_http(f"{prom}/-/ready", proc=server)
                deadline = time.monotonic() + 300
                while not ({"GpuUncorrectableEccErrors", "GpuCriticalXid"} <= set(_alerts(hook, "pager"))
                           and "GpuXidErrors" in _alerts(hook, "tickets")):  # fmt: skip
                    assert time.monotonic() < deadline and server.poll() is None, (hook.got, url)
                    time.sleep(1)
            finally:
                stop_all([server])
    took = max(t for _, t, _ in hook.got) - began
    pages, tickets = _alerts(hook, "pager"), _alerts(hook, "tickets")
    ecc, xid94 = pages["GpuUncorrectableEccErrors"], tickets["GpuXidErrors"]
    assert ecc["labels"]["gpu"] == "0" and ecc["labels"]["severity"] == "critical"
    assert xid94["labels"]["gpu"] == "1" and xid94["labels"]["severity"] == "warning"
    assert "GPU 1 on " in xid94["annotations"]["description"] and "XID 94" in xid94["annotations"]["description"]
    assert ecc["annotations"]["runbook_url"].startswith("https://") and "GpuXidErrors" not in pages
    assert not _alerts(hook, "owners") and "GpuUncorrectableEccErrors" not in tickets
    print(f"page and ticket {took:.0f} s after the demo started")
    assert took < 300

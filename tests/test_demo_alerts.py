"""``gpuwarden serve --demo faults`` fires a page and a ticket within minutes, through what ships and nothing shortened:
the rules and the Alertmanager routes ``gpuwarden mixin --out`` writes with its default parameters, a real Prometheus
scraping the demo every 15 s with deploy/prometheus/prometheus.yml's settings, and a real Alertmanager whose
receivers (pager, tickets, owners, chat) are one local webhook, each at its own path. docs/prometheus.md's walk-through
is this test's sequence of commands."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from helpers import REPO, alertmanager, daemon, prometheus, stop_all, wait_http

PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(PROMETHEUS is None or ALERTMANAGER is None, reason="prometheus/alertmanager not installed"),
]


class _Received(BaseHTTPRequestHandler):
    """Alertmanager's webhook notifications, kept with the receiver (the path) and when they came."""

    got: list[tuple[str, float, dict]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        _Received.got.append((self.path.strip("/"), time.monotonic(), json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def hook() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Received)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_port
    server.shutdown()


def _alerts(receiver: str) -> dict[str, dict]:
    """The firing alerts notified to ``receiver`` so far, by name (the last notification's)."""
    out = {}
    for path, _, body in _Received.got:
        if path == receiver:
            out.update({a["labels"]["alertname"]: a for a in body["alerts"] if a["status"] == "firing"})
    return out


def test_the_faults_demo_pages_and_tickets_through_the_shipped_rules_and_routes(hook: int, tmp_path: Path) -> None:
    assert PROMETHEUS is not None and ALERTMANAGER is not None
    made = subprocess.run([sys.executable, "-m", "gpuwarden", "mixin", "--out", str(tmp_path / "mixin")],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert made.returncode == 0, made.stderr
    routes = yaml.safe_load((tmp_path / "mixin" / "alertmanager" / "alertmanager.yml").read_text())
    for r in routes["receivers"]:
        r["webhook_configs"] = [{"url": f"http://127.0.0.1:{hook}/{r['name']}", "send_resolved": False}]
    shipped = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
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
            while not ({"GpuUncorrectableEccErrors", "GpuCriticalXid"} <= set(_alerts("pager"))
                       and "GpuXidErrors" in _alerts("tickets")):  # fmt: skip
                assert time.monotonic() < deadline and server.poll() is None, (_Received.got, url)
                time.sleep(1)
        finally:
            stop_all([server])
    took = max(t for _, t, _ in _Received.got) - began
    pages, tickets = _alerts("pager"), _alerts("tickets")
    ecc, xid94 = pages["GpuUncorrectableEccErrors"], tickets["GpuXidErrors"]
    assert ecc["labels"]["gpu"] == "0" and ecc["labels"]["severity"] == "critical"
    assert xid94["labels"]["gpu"] == "1" and xid94["labels"]["severity"] == "warning"
    assert "GPU 1 on " in xid94["annotations"]["description"] and "XID 94" in xid94["annotations"]["description"]
    assert ecc["annotations"]["runbook_url"].startswith("https://") and "GpuXidErrors" not in pages
    assert not _alerts("owners") and "GpuUncorrectableEccErrors" not in tickets
    print(f"page and ticket {took:.0f} s after the demo started")
    assert took < 300

"""The shipped routes in a real Alertmanager under a storm of alerts: each receiver gets at most one notification
per node (per cluster for the chat digest) in a group interval, whatever fires at once, and every alert in it names
its job and user. Alerts are posted to Alertmanager's API; deliveries land on a webhook, one path per receiver."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import httpx
import pytest
import yaml
from helpers import REPO, alertmanager

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
AMTOOL = shutil.which("amtool")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(ALERTMANAGER is None, reason="alertmanager not installed (.ci/run installs Debian's)"),
]


class _Hook(BaseHTTPRequestHandler):
    received: list[tuple[str, dict]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.received.append((self.path.strip("/"), json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def am(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Alertmanager with the shipped routes, group_wait cut to 2 s (the chat route's to 4 s)."""
    tmp: Path = tmp_path_factory.mktemp("am")
    hook = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    cfg = yaml.safe_load((REPO / "gpuwarden" / "mixin" / "alertmanager.yml").read_text())
    cfg["route"]["group_wait"] = "2s"
    for route in cfg["route"]["routes"]:
        if "group_wait" in route:
            route["group_wait"] = "4s" if route["receiver"] == "chat" else "2s"
    for r in cfg["receivers"]:  # the shipped webhooks' settings (max_alerts), delivered here
        r["webhook_configs"] = [{**w, "url": f"http://127.0.0.1:{hook.server_port}/{r['name']}", "send_resolved": False}
                                for w in r["webhook_configs"]]  # fmt: skip
    try:
        with alertmanager(ALERTMANAGER, tmp, cfg) as url:
            yield url
    finally:
        hook.shutdown()


def _post(am: str, alerts: list[dict[str, str]]) -> None:
    end = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    body = [{"labels": a, "annotations": {}, "endsAt": end} for a in alerts]
    assert httpx.post(f"{am}/api/v2/alerts", json=body, timeout=10).status_code == 200


def _storm() -> list[dict[str, str]]:
    """What a Prometheus restart lets fire at one moment on a 6-node cluster."""
    out: list[dict[str, str]] = []
    for job in range(14):  # 14 Slurm jobs with starved GPUs (an alert a job), one imbalanced across its nodes
        out.append({"alertname": "GpuStarved", "severity": "info", "cluster": "a", "job_id": f"{4000 + job}",
                    "job_kind": "slurm", "user": f"user{job}"})  # fmt: skip
    out.append({"alertname": "GpuJobImbalancedAcrossNodes", "severity": "info", "cluster": "a", "job_id": "4001"})
    for gpu in range(8):  # a cooling failure on n3: 8 hot GPUs, and GPU 3 fell off the bus
        out.append({"alertname": "GpuOverheating", "severity": "critical", "cluster": "a", "instance": "n3:10400",
                    "gpu": str(gpu), "uuid": f"GPU-3-{gpu}", "job_id": "5000", "user": "carol"})  # fmt: skip
    out.append({"alertname": "GpuLost", "severity": "critical", "cluster": "a", "instance": "n3:10400", "gpu": "3",
                "uuid": "GPU-3-3", "job_id": "5000", "user": "carol"})  # fmt: skip
    for node in range(4, 9):  # healthy plateaus above 90% on two GPUs of each of 5 nodes
        for gpu in (0, 1):
            out.append({"alertname": "GpuMemoryAlmostFull", "severity": "warning", "cluster": "a",
                        "instance": f"n{node}:10400", "gpu": str(gpu), "uuid": f"GPU-{node}-{gpu}",
                        "job_id": f"60{node}", "user": "dave"})  # fmt: skip
    return out


def _deliveries(receiver: str) -> list[dict]:
    return [m for path, m in _Hook.received if path == receiver]


def test_a_storm_is_one_notification_per_node_and_one_chat_digest(am: str) -> None:
    _post(am, _storm())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _deliveries("chat"):
        time.sleep(0.5)
    time.sleep(3)  # anything else due within the group wait has arrived by now
    pages, tickets, chat = _deliveries("pager"), _deliveries("tickets"), _deliveries("chat")
    # one page for n3, every GPU's alert in it, each naming the job and its user
    assert len(pages) == 1, [m["groupLabels"] for m in pages]
    assert pages[0]["groupLabels"] == {"cluster": "a", "instance": "n3:10400"}
    named = {(a["labels"]["alertname"], a["labels"]["gpu"]) for a in pages[0]["alerts"]}
    assert ("GpuLost", "3") in named and ("GpuOverheating", "3") not in named  # GpuLost speaks for its GPU
    assert len(named) == 8 and all(a["labels"]["job_id"] == "5000" for a in pages[0]["alerts"])
    # one ticket per node with plateaus (five), never one per GPU
    assert sorted(m["groupLabels"]["instance"] for m in tickets) == [f"n{n}:10400" for n in range(4, 9)]
    assert all(len(m["alerts"]) == 2 for m in tickets)
    # one chat digest for the cluster: the 14 starved jobs and the cross-node imbalance
    assert len(chat) == 1 and chat[0]["groupLabels"] == {"cluster": "a"}
    assert len(chat[0]["alerts"]) == 15 and chat[0]["truncatedAlerts"] == 0
    # no group is keyed on a job
    assert not any("job_id" in m["groupLabels"] for _, m in _Hook.received)


def test_a_cluster_of_200_starved_jobs_is_one_bounded_chat_digest(am: str) -> None:
    """200 jobs with starved GPUs (a 1,600-GPU cluster of 8-GPU jobs, every one starved) make one chat message of at
    most 30 alerts, which says how many it left out."""
    _post(am, [{"alertname": "GpuStarved", "severity": "info", "cluster": "big", "job_id": f"{9000 + j}",
                "job_kind": "slurm", "user": f"u{j % 17}"} for j in range(200)])  # fmt: skip

    def big() -> list[dict]:
        return [m for m in _deliveries("chat") if m["groupLabels"] == {"cluster": "big"}]

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not big():
        time.sleep(0.5)
    [digest] = big()
    assert len(digest["alerts"]) == 30 and digest["truncatedAlerts"] == 170
    assert len(json.dumps(digest)) < 64 * 1024  # a chat message, not a quarter of a megabyte


def test_another_hot_gpu_on_the_node_does_not_page_again_within_the_group_interval(am: str) -> None:
    before = len(_deliveries("pager"))
    _post(am, [{"alertname": "GpuMemoryOverheating", "severity": "critical", "cluster": "a", "instance": "n3:10400",
                "gpu": "5", "uuid": "GPU-3-5", "job_id": "5000", "user": "carol"}])  # fmt: skip
    time.sleep(6)  # three group waits: a group of its own would have paged by now
    assert len(_deliveries("pager")) == before


@pytest.mark.skipif(AMTOOL is None, reason="amtool not installed (.ci/run installs Debian's alertmanager)")
def test_the_runbooks_maintenance_silence_mutes_the_node_and_only_it(am: str) -> None:
    """The amtool commands of docs/runbook.md ("Silencing a node for maintenance"), run as written against a real
    Alertmanager: the node's new page is muted, another node's is not; the silence expires when told to."""
    runbook = (REPO / "docs" / "runbook.md").read_text()
    section = runbook.split("### Silencing a node for maintenance", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    add, query, expire = [line.split("#")[0].strip() for line in section.replace("\\\n", " ").splitlines() if line]
    url = f"--alertmanager.url={am}"

    def amtool(cmd: str) -> str:
        args = [url if a.startswith("--alertmanager.url=") else a for a in shlex.split(cmd)[1:]]  # "amtool ..."
        res = subprocess.run([AMTOOL, *args], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout

    silence_id = amtool(add).strip()  # silence add prints the new silence's id: what expire takes
    node = re.search(r'instance="([^"]+)"', add).group(1)  # type: ignore[union-attr]
    assert silence_id in amtool(query)
    before = len(_deliveries("pager"))
    page = {"alertname": "GpuLost", "severity": "critical", "cluster": "a", "gpu": "0", "job_id": "7", "user": "x"}
    _post(am, [{**page, "instance": node, "uuid": "GPU-m"}, {**page, "instance": "n9:10400", "uuid": "GPU-n"}])
    time.sleep(6)
    paged = [m["groupLabels"]["instance"] for m in _deliveries("pager")[before:]]
    assert paged == ["n9:10400"], paged
    amtool(expire.replace("SILENCE_ID", silence_id))
    # expired: no longer active (the muted page goes out at the group's next interval, 5 minutes)
    assert silence_id not in amtool(query)

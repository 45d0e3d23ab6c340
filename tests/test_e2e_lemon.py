"""Fail-slow suspects through a real Prometheus: two replayed 2-GPU nodes each run three Slurm jobs in a row
(derived traces, tests/data/make_lemon_traces.py, marked ``modified``). On "lemon" GPU 1 is the straggler of all three
jobs; on "moving" the straggling moves to GPU 0 in the second job. The shipped rules (with windows shortened to the
test's minutes) mark lemon's GPU 1 suspect and raise GpuSuspectFailSlow for it alone; ``top --suspects`` finds the
same GPU without the rules and says its evidence is not on the node (the derived traces have no local fault)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml
from helpers import REPO, prometheus, replay_nodes, stop_all, wait_http

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.xdist_group("lemon"),  # one worker builds the module's stack, not each (--dist loadgroup)
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (CI installs Debian's package)"),
]
NODES = {"lemon": "derived-h200x2-lemon", "moving": "derived-h200x2-moving"}
PARAMS = {"straggler_for": "10s", "suspect_range": "10m", "suspect_min_jobs": 3}


def _query(prom: str, expr: str) -> list[dict]:
    body = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("lemon")
    procs, ports = replay_nodes(NODES, {n: {"GPUWARDEN_NODE_NAME": n} for n in NODES})
    (tmp / "params.yml").write_text(yaml.safe_dump(PARAMS))
    gen = subprocess.run([sys.executable, str(REPO / "alerts" / "generate.py"), "--params", str(tmp / "params.yml"),
                          "--out", str(tmp / "rules.yml")], capture_output=True, text=True, check=False)  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    rules = yaml.safe_load((tmp / "rules.yml").read_text())
    for group in rules["groups"]:
        group.pop("interval", None)  # every group at the global 1 s
    (tmp / "rules.yml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp / "rules.yml")],
        "scrape_configs": [{"job_name": "gpuwarden", "static_configs": [
            {"targets": [f"127.0.0.1:{ports[n]}"], "labels": {"scenario": n}} for n in NODES]}],
    }  # fmt: skip
    server, url = prometheus(PROMETHEUS, tmp, config)
    procs.append(server)
    try:
        for p in ports.values():
            wait_http(f"http://127.0.0.1:{p}/healthz")
        wait_http(f"{url}/-/ready")
        # the three jobs of each trace take 90 s of replay: wait for the lemon's third (the state, not a sleep)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            counts = _query(url, f'uuid:gpu_straggler_jobs:count{{instance="127.0.0.1:{ports["lemon"]}"}}')
            if any(float(r["value"][1]) >= 3 for r in counts):
                break
            time.sleep(2)
        time.sleep(5)  # an evaluation or two more, so the alert rule has read the count
        yield {"url": url, "ports": ports}
    finally:
        stop_all(procs)


def test_the_gpu_that_held_back_three_jobs_is_marked_and_alerted_and_no_other(prom: dict) -> None:
    node = {f"127.0.0.1:{p}": n for n, p in prom["ports"].items()}
    counts = {(node[r["metric"]["instance"]], r["metric"]["gpu"]): float(r["value"][1])
              for r in _query(prom["url"], "uuid:gpu_straggler_jobs:count")}  # fmt: skip
    assert counts[("lemon", "1")] == 3 and ("lemon", "0") not in counts
    assert counts.get(("moving", "1"), 0) <= 2 and counts.get(("moving", "0"), 0) <= 1, counts
    firing = _query(prom["url"], 'ALERTS{alertname="GpuSuspectFailSlow", alertstate="firing"}')
    assert [(node[a["metric"]["instance"]], a["metric"]["gpu"]) for a in firing] == [("lemon", "1")]
    assert firing[0]["metric"]["severity"] == "warning"


def test_top_suspects_finds_it_without_the_rules_and_says_the_evidence_is_not_on_the_node(prom: dict) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "top", "--suspects", "--prometheus", prom["url"], "--range", "5m",
         "--step", "1s", "--suspects.straggler-for", "10s", "--json"],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    lemon = f"127.0.0.1:{prom['ports']['lemon']}"
    assert [(s["instance"], s["gpu"], s["node"]) for s in doc["suspects"]] == [(lemon, "1", "lemon")]
    assert doc["suspects"][0]["jobs"] == 3 and doc["suspects"][0]["evidence"] == []
    text = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "top", "--suspects", "--prometheus", prom["url"], "--range", "5m",
         "--step", "1s", "--suspects.straggler-for", "10s"],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
    )  # fmt: skip
    assert text.returncode == 0 and "none: not on this node" in text.stdout and "lemon" in text.stdout


def test_top_suspects_as_a_slurm_exclude_list(prom: dict) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "top", "--suspects", "--prometheus", prom["url"], "--range", "5m",
         "--step", "1s", "--suspects.straggler-for", "10s", "--format", "slurm"],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert 'scontrol update NodeName=lemon State=DRAIN Reason="gpuwarden fail-slow suspect"' in res.stdout
    assert "# lemon: GPU 1 the straggler of 3 jobs" in res.stdout

"""``gpuwarden drain --scheduler kubernetes`` against a real Prometheus scraping a daemon that replays an H100
recording whose GPU needs service (derived-h100-health: 3 uncorrectable ECC errors, as the trace's header says it was
modified), and a stand-in API server that checks each write against Kubernetes 1.30's Node schema
(tests/kube_apiserver.py): a dry run plans and writes nothing; ``--apply`` taints the node and sets its
GPUNeedsService condition; a second run does nothing more; once the node's GPU has been clean over the range (the
daemon now replays the idle H100 recording under the same node name) the taint is removed and the condition cleared.
Each run's decisions are in the textfile it writes, read back with prometheus_client's parser."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TRACES
from helpers import REPO, free_port, prometheus, scraping, stop_all, wait_http
from kube_apiserver import ApiServer, node
from prometheus_client.parser import text_string_to_metric_families
from slurm_node import serve_replay, wait_for

from gpuwarden.cluster.exclude import SERVICE_TAINT_KEY
from gpuwarden.cluster.kube import CONDITION

PROMETHEUS = shutil.which("prometheus")
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed")]
RANGE = "20s"
NODE = "gpu-node-1"


def _drain(url: str, api: str, textfile: Path, *extra: str) -> dict:
    res = subprocess.run([sys.executable, "-m", "gpuwarden", "drain", "--scheduler", "kubernetes", "--kube-api", api,
                          "--prometheus", url, "--range", RANGE, "--step", "1s", "--json", "--max-out-ratio", "0.5",
                          "--textfile", str(textfile), *extra], capture_output=True, text=True, cwd=REPO,
                         timeout=120, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _metrics(textfile: Path) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(textfile.read_text())
        for s in fam.samples
    }


def _ours(obj: dict) -> list[dict]:
    return [t for t in obj["spec"].get("taints", []) if t["key"] == SERVICE_TAINT_KEY]


def _condition(obj: dict) -> dict | None:
    return next((c for c in obj["status"]["conditions"] if c["type"] == CONDITION), None)


def test_a_node_whose_gpu_needs_service_is_tainted_then_untainted_once_clean(tmp_path: Path) -> None:
    port = free_port()
    server, url = prometheus(PROMETHEUS or "prometheus", tmp_path, scraping(port))
    procs: list[subprocess.Popen] = [server]
    textfile = tmp_path / "gpuwarden_drain.prom"
    nodes = [node(NODE), node("gpu-node-2"), node("gpu-node-3"), node("cpu-node-1", unschedulable=True)]
    try:
        with ApiServer(nodes) as api:
            named = {"GPUWARDEN_NODE_NAME": NODE}
            procs.append(serve_replay(TRACES / "derived-h100-health.jsonl.gz", port, tmp_path / "sick.log", **named))
            wait_http(f"{url}/-/ready")
            wait_for("a drain planned", lambda: _drain(url, api.url, textfile)["actions"], 90)
            planned = _drain(url, api.url, textfile)["actions"]
            assert [(a["action"], a["node"], a["status"]) for a in planned] == [("drain", NODE, "planned")]
            assert not [r for r in api.requests if r[0] == "PUT"]  # a dry run writes nothing
            metrics = _metrics(textfile)
            key = (("action", "drain"), ("node", NODE), ("scheduler", "kubernetes"), ("status", "planned"))
            assert metrics[("gpuwarden_drain_decision", key)] == 1
            done = _drain(url, api.url, textfile, "--apply")["actions"]
            assert [(a["action"], a["status"]) for a in done] == [("drain", "done")]
            stored = api.nodes[NODE]
            assert _ours(stored) == [{"key": SERVICE_TAINT_KEY, "value": "gpu0", "effect": "NoSchedule"}]
            cond = _condition(stored)
            assert cond is not None and cond["status"] == "True"
            assert cond["message"].startswith("gpuwarden: GPU 0: ") and "uncorrectable ECC errors" in cond["message"]
            assert api.rejected == []  # every write passed the schema
            metrics = _metrics(textfile)
            assert metrics[("gpuwarden_drain_nodes_held_out", (("scheduler", "kubernetes"),))] == 1
            assert metrics[("gpuwarden_drain_nodes", (("scheduler", "kubernetes"),))] == 4
            assert _drain(url, api.url, textfile, "--apply")["actions"] == []  # out already: nothing more
            # an API server that does not answer: one line, exit 1, no traceback
            dead = subprocess.run([sys.executable, "-m", "gpuwarden", "drain", "--scheduler", "kubernetes",
                                   "--kube-api", f"http://127.0.0.1:{free_port()}", "--prometheus", url, "--range",
                                   RANGE, "--step", "1s"], capture_output=True, text=True, cwd=REPO, timeout=120,
                                  check=False)  # fmt: skip
            assert dead.returncode == 1 and dead.stderr.count("\n") == 1, dead.stderr
            assert dead.stderr.startswith("gpuwarden: drain:") and "API server" in dead.stderr
            stop_all(procs[1:])
            procs[1:] = [serve_replay(TRACES / "h100-idle.jsonl.gz", port, tmp_path / "clean.log", **named)]
            resumed: list[dict] = []

            def resume() -> list[dict]:
                resumed[:] = _drain(url, api.url, textfile, "--apply")["actions"]
                return resumed

            wait_for("a run that resumes the node", resume, 120)
            assert [(a["action"], a["node"], a["status"]) for a in resumed] == [("resume", NODE, "done")]
            stored = api.nodes[NODE]
            cond = _condition(stored)
            assert _ours(stored) == [] and cond is not None and cond["status"] == "False"
            assert cond["reason"] == "GpuwardenClean" and api.rejected == []
            assert api.nodes["cpu-node-1"]["spec"]["unschedulable"] is True  # someone else's cordon: untouched
            metrics = _metrics(textfile)
            assert metrics[("gpuwarden_drain_nodes_held_out", (("scheduler", "kubernetes"),))] == 0
            counted = (("action", "resume"), ("scheduler", "kubernetes"), ("status", "done"))
            assert metrics[("gpuwarden_drain_actions", counted)] == 1
    finally:
        stop_all(procs)

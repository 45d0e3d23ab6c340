"""``gpuwarden drain`` against a real Slurm (tests/slurm_node.py) and a real Prometheus scraping a daemon that replays
an H100 recording whose GPU needs service (derived-h100-health: 3 uncorrectable ECC errors, as the trace's header
says it was modified): a dry run plans the drain and changes nothing (and without a scheduler to ask, plans it from
Prometheus alone, said in one line); ``--apply`` drains the node with the reason;
a second run does nothing more; once the node's GPU has been clean over the range (the daemon now replays the idle
H100 recording under the same node name) the node is resumed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import TRACES
from helpers import REPO, free_port, prometheus, stop_all, wait_http
from slurm_node import NEEDS, PROMETHEUS, node_name, out, serve_replay, slurm_node, wait_for

pytestmark = NEEDS
RANGE = "20s"
#: The daemons' node name: the Slurm node's, as a site sets node_name to Slurm's NodeName.
NAMED = {"GPUWARDEN_NODE_NAME": node_name()}


def _drain(url: str, env: dict[str, str], *extra: str) -> dict:
    res = subprocess.run([sys.executable, "-m", "gpuwarden", "drain", "--prometheus", url, "--range", RANGE,
                          "--step", "1s", "--json", "--max-out-ratio", "1", *extra], capture_output=True, text=True,
                         cwd=REPO, env=env, timeout=120, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _state(env: dict[str, str]) -> tuple[str, str]:
    state, _, reason = out(["sinfo", "-h", "-N", "-o", "%T|%E"], env).strip().partition("|")
    return state, reason


def test_a_node_whose_gpu_needs_service_is_drained_then_resumed_once_clean(tmp_path: Path) -> None:
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "gpuwarden", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
    }
    server, url = prometheus(PROMETHEUS or "prometheus", tmp_path, config)  # fmt: skip
    procs: list[subprocess.Popen] = [server]
    slurm = tmp_path / "slurm"
    slurm.mkdir()
    try:
        with slurm_node(slurm) as env:
            procs.append(serve_replay(TRACES / "derived-h100-health.jsonl.gz", port, tmp_path / "sick.log", **NAMED))
            wait_http(f"{url}/-/ready")
            node = node_name()
            wait_for("a drain planned", lambda: _drain(url, env)["actions"], 90)
            planned = _drain(url, env)["actions"]
            assert [(a["action"], a["node"], a["status"]) for a in planned] == [("drain", node, "planned")]
            assert _state(env)[0] == "idle"  # a dry run changes nothing
            # outside a pod without --kube-api: a dry run from Prometheus alone, said in one line; --apply refuses
            bare = {k: v for k, v in env.items() if not k.startswith("KUBERNETES_")}
            kube = [sys.executable, "-m", "gpuwarden", "drain", "--prometheus", url, "--range", RANGE, "--step", "1s",
                    "--json", "--scheduler", "kubernetes"]  # fmt: skip
            alone = subprocess.run(kube, capture_output=True, text=True, cwd=REPO, env=bare, timeout=120, check=False)
            assert alone.returncode == 0, alone.stderr
            actions = json.loads(alone.stdout)["actions"]
            assert [(a["action"], a["node"], a["status"]) for a in actions] == [("drain", node, "planned")]
            assert alone.stderr.count("\n") == 1 and "a dry run from Prometheus alone" in alone.stderr
            assert "--kube-api" in alone.stderr
            refused = subprocess.run([*kube, "--apply"], capture_output=True, text=True, cwd=REPO, env=bare,
                                     timeout=120, check=False)  # fmt: skip
            assert refused.returncode == 1 and refused.stderr.count("\n") == 1 and "--kube-api" in refused.stderr
            done = _drain(url, env, "--apply")["actions"]
            assert [(a["action"], a["status"]) for a in done] == [("drain", "done")]
            state, reason = _state(env)
            assert (
                state in ("drained", "draining")
                and reason.startswith("gpuwarden: GPU 0: ")
                and "uncorrectable ECC errors" in reason
            )
            assert _drain(url, env, "--apply")["actions"] == []  # out already: nothing more
            stop_all(procs[1:])
            procs[1:] = [serve_replay(TRACES / "h100-idle.jsonl.gz", port, tmp_path / "clean.log", **NAMED)]
            # as its timer would: a run every few seconds until one resumes the node (the first runs after the switch
            # still see the old GPU's errors in the range, and do nothing)
            resumed: list[dict] = []

            def resume() -> list[dict]:
                resumed[:] = _drain(url, env, "--apply")["actions"]
                return resumed

            wait_for("a run that resumes the node", resume, 120)
            assert [(a["action"], a["node"], a["status"]) for a in resumed] == [("resume", node, "done")]
            state, reason = _state(env)  # idle again ("*": slurmd not answering its ping yet, this test's own node)
            assert state.rstrip("*") == "idle" and not reason.startswith("gpuwarden:")
    finally:
        stop_all(procs)

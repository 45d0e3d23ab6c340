"""A real Slurm on one node (Debian's slurmctld, slurmd and munge; two GPUs declared as gres over stand-in device
files) with the shipped prolog and epilog, a real Prometheus scraping the daemons, and the daemons replaying real H100
recordings with the job mapping directory the prolog writes:

1. job 4242 is allocated both GPUs and runs on GPU 0 only (h100x2-one-of-two: bf16 products on GPU 0 of two, recorded
   with ``gpuwarden record``; its processes put in job 4242's cgroup, the trace marked modified): GPU 1 is
   ``allocated_idle`` in the daemon's series and verdict, and ``report --job 4242`` counts its time lost to it;
2. the epilog clears the mapping when the job is cancelled;
3. job 4243 is allocated one GPU and opens nothing (a node replaying h100-idle, a GPU nobody opened): the reclaim
   ladder climbs it on allocated_idle.

Needs root (slurmd and munged run as root here) and the packages; CI installs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import TRACES
from helpers import REPO, free_port, prometheus, stop_all, wait_http
from slurm_node import FIRST_JOB, NEEDS, PROMETHEUS, out, serve_replay, slurm_node, wait_for

from gpuwarden.trace import TraceWriter, read_trace

pytestmark = NEEDS
POLICY = """\
interval: 10s
steps:
  - name: notify
    after: 20s
"""


def _mapping(tmp: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((tmp / "jobs").iterdir())} if (tmp / "jobs").exists() else {}


def _as_job(src: Path, out: Path, job: int) -> Path:
    """``src`` with every GPU process in the cgroup of Slurm job ``job`` (the recording's are in a container's), its
    header saying so."""
    header, polls = read_trace(src)
    meta = {**header.metadata, "modified": f"every GPU process in the cgroup of Slurm job {job}; readings unchanged"}
    cgroup = f"/system.slice/slurmstepd.scope/job_{job}/step_batch/user/task_0"
    with TraceWriter(out, header.model_copy(update={"metadata": meta})) as w:
        for poll in polls:
            gpus = [g.model_copy(update={"processes": [p.model_copy(update={"cgroup": cgroup}) for p in g.processes]})
                    if g.processes else g for g in poll.gpus]  # fmt: skip
            w.write(poll.model_copy(update={"gpus": gpus}))
    return out


def _query(url: str, q: str) -> list[dict]:
    return httpx.get(f"{url}/api/v1/query", params={"query": q}, timeout=30).json()["data"]["result"]


def gw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwarden", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, check=False, env={**os.environ, "COLUMNS": "200"})  # fmt: skip


def test_a_slurm_job_allocated_two_gpus_touching_one_and_a_job_touching_none(tmp_path: Path) -> None:
    node_a, node_b = free_port(), free_port()
    derived = _as_job(TRACES / "h100x2-one-of-two.jsonl.gz", tmp_path / "one-of-two-4242.jsonl.gz", FIRST_JOB)
    config = {"global": {"scrape_interval": "1s"},
              "scrape_configs": [{"job_name": "gpuwarden", "static_configs": [
                  {"targets": [f"127.0.0.1:{node_a}", f"127.0.0.1:{node_b}"]}]}]}  # fmt: skip
    server, url = prometheus(PROMETHEUS or "prometheus", tmp_path, config)
    procs: list[subprocess.Popen] = [server]
    slurm = tmp_path / "slurm"
    slurm.mkdir()
    try:
        with slurm_node(slurm) as env:
            # 1. two GPUs allocated, GPU 0 used
            out(["sbatch", "--gres=gpu:2", "-o", "/dev/null", "--wrap", "sleep 600"], env)
            wait_for("the prolog's mapping of job 4242", lambda: _mapping(slurm) == {"0": "4242\n", "1": "4242\n"})
            a = serve_replay(derived, node_a, tmp_path / "a.log", GPUWARDEN_JOB_MAPPING_DIR=str(slurm / "jobs"))
            procs.append(a)
            wait_http(f"{url}/-/ready")
            idle = 'gpu_state_seconds_total{gpu="1",state="allocated_idle"}'
            wait_for("30 s of GPU 1 allocated and untouched", lambda: any(
                float(s["value"][1]) > 30 for s in _query(url, idle)), 120)  # fmt: skip
            jobs = {(s["metric"]["gpu"], s["metric"]["job_id"]) for s in _query(url, "gpu_job_info")}
            assert jobs == {("0", "4242"), ("1", "4242")}  # GPU 0's processes and its allocation: one job
            verdicts = {s["metric"]["gpu"]: s["metric"]["reason"] for s in _query(url, "gpu_diagnosis == 1")
                        if s["metric"]["reason"] in ("allocated_idle", "compute_bound", "free")}  # fmt: skip
            assert verdicts == {"0": "compute_bound", "1": "allocated_idle"}
            res = gw("report", "--job", "4242", "--prometheus", url, "--range", "20s", "--step", "1s", "--json")
            assert res.returncode == 0, res.stderr
            doc = json.loads(res.stdout)
            assert len(doc["gpus"]) == 2 and doc["held_gpu_hours"] == pytest.approx(2 * 20 / 3600, rel=0.2)
            lost = doc["lost_gpu_hours_by_cause"]
            assert lost["allocated_idle"] == pytest.approx(20 / 3600, rel=0.2), lost
            # 2. the epilog clears the mapping
            out(["scancel", "4242"], env)
            wait_for("the epilog to clear the mapping", lambda: _mapping(slurm) == {})
            stop_all([a])
            # 3. one GPU allocated, nothing opened: a node whose GPU 0 nobody opens
            out(["sbatch", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 600"], env)
            wait_for("the prolog's mapping of job 4243", lambda: _mapping(slurm) == {"0": "4243\n"})
            procs.append(
                serve_replay(
                    TRACES / "h100-idle.jsonl.gz",
                    node_b,
                    tmp_path / "b.log",
                    GPUWARDEN_JOB_MAPPING_DIR=str(slurm / "jobs"),
                )
            )
            on_b = f'gpu_state_seconds_total{{instance="127.0.0.1:{node_b}",state="allocated_idle"}}'
            wait_for("40 s of job 4243's GPU allocated and untouched", lambda: any(
                float(s["value"][1]) > 40 for s in _query(url, on_b)), 120)  # fmt: skip
            policy = tmp_path / "policy.yml"
            policy.write_text(POLICY)
            res = gw("reclaim", "--policy", str(policy), "--prometheus", url, "--report", "--json", "--range", "40s")
            assert res.returncode == 0, res.stderr
            rows = json.loads(res.stdout)["decisions"]
            assert {(r["job_id"], r["step"]) for r in rows} == {("4243", "notify")}, rows
            assert "allocated_idle" in rows[0]["reasons"]
    finally:
        stop_all(procs)

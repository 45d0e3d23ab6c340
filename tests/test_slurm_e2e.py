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
import time
from pathlib import Path
from typing import Any

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
    """The job mapping's GPU files and the owners the prolog wrote (``owners/<id>``)."""
    jobs = tmp / "jobs"
    files = sorted(p for p in [*jobs.glob("*"), *jobs.glob("owners/*")] if p.is_file()) if jobs.exists() else []
    return {str(p.relative_to(jobs)): p.read_text() for p in files}


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


def _by_account_equals_promql(url: str) -> None:
    """``top --by account`` (JSON and CSV) equals hand-written PromQL over the raw series at the same instant: the
    GPU-hours held (every state but free) and lost by cause of the GPUs of each account's jobs, the counters' growth
    over the range (their value at its end less at its start: no extrapolation), priced at the model's price."""
    at = f"{time.time() - 2:.3f}"  # a moment every sample of has been scraped
    res = gw("top", "--by", "account", "--prometheus", url, "--range", "20s", "--step", "1s", "--at", at, "--json")
    assert res.returncode == 0, res.stderr
    [row] = json.loads(res.stdout)["owners"]
    owned = 'max by (instance, gpu, account) (max_over_time(gpu_job_info{account!=""}[20s]))'

    def by_account(counter: str) -> float:
        grown = f"sum by (instance, gpu) ({counter} - {counter} offset 20s)"
        q = f"sum by (account) ({grown} * on (instance, gpu) group_left (account) {owned})"
        [s] = httpx.get(f"{url}/api/v1/query", params={"query": q, "time": at}, timeout=30).json()["data"]["result"]
        assert s["metric"] == {"account": "physics"}
        return float(s["value"][1]) / 3600

    held = by_account('gpu_state_seconds_total{state!="free"}')
    lost = by_account('gpu_idle_seconds_total{cause="allocated_idle"}')
    assert row["owner"] == "physics" and row["jobs"] == 1 and row["gpus"] == 2
    assert row["held_gpu_hours"] == pytest.approx(held, rel=0.01)
    assert row["lost_gpu_hours_by_cause"]["allocated_idle"] == pytest.approx(lost, rel=0.01) and lost > 0
    assert row["lost_cost"] == pytest.approx(3.0 * row["lost_gpu_hours"], rel=1e-9)  # the H100's price, not the default
    assert row["held_cost"] == pytest.approx(3.0 * held, rel=0.01) and row["currency"] == "USD"
    csv = gw("top", "--by", "account", "--prometheus", url, "--range", "20s", "--step", "1s", "--at", at,
             "--format", "csv")  # fmt: skip
    head, line = csv.stdout.splitlines()
    cells = dict(zip(head.split(","), line.split(","), strict=True))
    six: dict[str, Any] = {"abs": 5e-7, "rel": 0}  # the CSV's 6 decimals
    assert cells["account"] == "physics"
    assert float(cells["held_gpu_hours"]) == pytest.approx(row["held_gpu_hours"], **six)
    idle = row["lost_gpu_hours_by_cause"]["allocated_idle"]
    assert float(cells["lost_allocated_idle_cost"]) == pytest.approx(row["lost_cost_by_cause"]["allocated_idle"], **six)
    print(f"top --by account: held {row['held_gpu_hours']:.6f} h (PromQL {held:.6f}), allocated_idle {idle:.6f} h "
          f"(PromQL {lost:.6f}), lost cost {row['lost_cost']:.6f}")  # fmt: skip


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
            out(["sbatch", "--gres=gpu:2", "--account=physics", "-o", "/dev/null", "--wrap", "sleep 600"], env)
            wait_for("the prolog's mapping of job 4242", lambda: _mapping(slurm) == {
                "0": "4242\n", "1": "4242\n", "owners/4242": "user=root\naccount=physics\n"})  # fmt: skip
            a = serve_replay(derived, node_a, tmp_path / "a.log", GPUWARDEN_JOB_MAPPING_DIR=str(slurm / "jobs"),
                             GPUWARDEN_GPU_HOUR_PRICES=json.dumps({"NVIDIA H100 80GB HBM3": 3.0, "Tesla T4": 0.35}),
                             GPUWARDEN_PRICE_PER_GPU_HOUR="1")  # fmt: skip
            procs.append(a)
            wait_http(f"{url}/-/ready")
            idle = 'gpu_state_seconds_total{gpu="1",state="allocated_idle"}'
            wait_for("30 s of GPU 1 allocated and untouched", lambda: any(
                float(s["value"][1]) > 30 for s in _query(url, idle)), 120)  # fmt: skip
            jobs = {(s["metric"]["gpu"], s["metric"]["job_id"], s["metric"]["account"], s["metric"]["user"])
                    for s in _query(url, "gpu_job_info")}  # fmt: skip
            # GPU 0's processes and its allocation: one job, owned as Slurm says
            assert jobs == {("0", "4242", "physics", "root"), ("1", "4242", "physics", "root")}
            _by_account_equals_promql(url)
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
            wait_for("the prolog's mapping of job 4243", lambda: _mapping(slurm).get("0") == "4243\n")
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

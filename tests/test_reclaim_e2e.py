"""The reclaim ladder on a real Prometheus over recordings: 45 minutes of three nodes' real exposition (each a recorded
H100 trace replayed through the poller, analyzer and collectors in recorded time, tests/backfill.py), backfilled with
promtool. node-a's job holds 60 GB and runs nothing (h100-held_idle), node-b's is starved by its data loader
(h100-starved_dataloader), node-c's runs bf16 products (h100-compute_bound); node-a's and node-b's jobs are labelled
Slurm jobs (the recordings' are plain processes: the label is changed, the samples are not). The held-idle job climbs to
reclaim in the dry-run report, one step at a time; the starved and the busy ones never appear. The controller with
actions on runs the first step's command once, for the held-idle job only."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from backfill import openmetrics, replayed
from conftest import trace
from helpers import REPO, backfilled_prometheus

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None, reason="prometheus/promtool not installed"),
]
MINUTES = 45
NODES = {"node-a:10400": "h100-held_idle", "node-b:10400": "h100-starved_dataloader",
         "node-c:10400": "h100-compute_bound"}  # fmt: skip
POLICY = """\
interval: 1m
steps:
  - name: notify
    after: 5m
    command: [{python}, -c, "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + ' ' + sys.argv[3] + '\\\\n')",
              {out}, "{{job_id}}", "{{nodes}}"]
  - name: warn
    after: 10m
  - name: reclaim
    after: 15m
    command: [{python}, -c, "raise SystemExit(3)"]
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("reclaim")
    end = time.time() - 30
    start = end - MINUTES * 60
    series = [replayed(trace(name), {"instance": inst, "job": "gpuwarden"}, start, MINUTES * 60)
              for inst, name in NODES.items()]  # fmt: skip
    # node-a's and node-b's jobs as Slurm jobs (the recordings' are plain processes): what the example policy selects
    series = [{(name, _as_slurm(labels) if inst != "node-c:10400" else labels): points
               for (name, labels), points in s.items()} for inst, s in zip(NODES, series, strict=True)]  # fmt: skip
    with backfilled_prometheus(PROMETHEUS, PROMTOOL, tmp, openmetrics(*series)) as url:
        yield {"url": url, "end": end, "tmp": tmp}


def _as_slurm(labels: str) -> str:
    """A series' label text with its job's kind set to slurm."""
    return re.sub(r'job_kind="[^"]*"', 'job_kind="slurm"', labels)


def _policy(tmp: Path, dry_run: bool) -> tuple[Path, Path]:
    out = tmp / f"actions-{dry_run}.txt"
    text = POLICY.format(python=json.dumps(sys.executable), out=json.dumps(str(out)))
    path = tmp / f"policy-{dry_run}.yml"
    path.write_text(("dry_run: false\n" if not dry_run else "") + text)
    return path, out


def gw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwarden", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, check=False, env={**os.environ, "COLUMNS": "200"})  # fmt: skip


def test_the_report_climbs_the_held_idle_job_to_reclaim_and_never_the_starved_or_busy_ones(stack: dict) -> None:
    policy, _ = _policy(stack["tmp"], dry_run=True)
    res = gw("reclaim", "--policy", str(policy), "--prometheus", stack["url"], "--report", "--json",
             "--range", "25m", "--at", f"{stack['end']:.3f}")  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    rows = doc["decisions"]
    assert {r["instance"] for r in rows} == {"node-a:10400"}, rows  # the starved and the busy jobs: nothing
    steps = [(r["step"], r["time"]) for r in rows]
    assert [s for s, _ in steps] == ["notify", "warn", "reclaim"]
    start = stack["end"] - 25 * 60
    # idle long before the range: notify at its first tick, then each step the gap between the steps later
    assert steps[0][1] - start <= 61
    assert 299 <= steps[1][1] - steps[0][1] <= 301 and 299 <= steps[2][1] - steps[1][1] <= 301
    assert all(r["outcome"] == "dry_run" and "held_idle" in r["reasons"] for r in rows)
    assert "100% of it idle" in rows[0]["evidence"]
    assert doc["reached"]["reclaim"] and all("node-a" in j for j in doc["reached"]["reclaim"])


def test_the_report_as_a_table_on_a_pipe(stack: dict) -> None:
    policy, _ = _policy(stack["tmp"], dry_run=True)
    res = gw("reclaim", "--policy", str(policy), "--prometheus", stack["url"], "--report", "--range", "25m",
             "--at", f"{stack['end']:.3f}")  # fmt: skip
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("# reclaim ladder") and lines[1].split("\t")[:3] == ["time (UTC)", "job", "step"]
    assert [line.split("\t")[2] for line in lines[2:]] == ["notify", "warn", "reclaim"]


def test_the_controller_runs_the_first_step_once_for_the_held_idle_job_only(stack: dict) -> None:
    """With actions on, one evaluation now (after warming up on the history): the held-idle job, idle for 45
    minutes, gets the first step only (each next step comes the gap later), its command run once with its names."""
    policy, out = _policy(stack["tmp"], dry_run=False)
    res = gw("reclaim", "--policy", str(policy), "--prometheus", stack["url"], "--once", "--at", f"{stack['end']:.3f}")
    assert res.returncode == 0, res.stderr
    ran = out.read_text().splitlines()
    assert len(ran) == 1 and ran[0].endswith(" node-a:10400"), ran
    assert "step notify:" in res.stderr and "outcome=ran" in res.stderr, res.stderr
    assert "node-b" not in res.stderr and "node-c" not in res.stderr


def test_the_shipped_example_policy_climbs_the_held_idle_slurm_job_only(stack: dict) -> None:
    """deploy/reclaim-policy.example.yml as shipped (Slurm jobs, held_idle): the held-idle Slurm job climbs to its
    reclaim step in the dry-run report; the starved Slurm job and the busy plain process never appear."""
    example = REPO / "deploy" / "reclaim-policy.example.yml"
    res = gw("reclaim", "--policy", str(example), "--prometheus", stack["url"], "--report", "--json",
             "--range", "40m", "--at", f"{stack['end']:.3f}")  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["decisions"]
    assert {r["instance"] for r in rows} == {"node-a:10400"}, rows
    assert [r["step"] for r in rows] == ["notify"]  # 30 minutes idle; warn comes at an hour
    assert rows[0]["job_kind"] == "slurm" and "held_idle" in rows[0]["reasons"]

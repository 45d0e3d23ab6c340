"""GPU quality across jobs (``top --quality``) on a real Prometheus: an hour of four nodes' real exposition (recorded
traces replayed through the daemon's poller, analyzer and collectors, tests/backfill.py), backfilled with promtool.
node-health's H100 carries uncorrectable ECC errors, a pending row remap and XID 63 (derived-h100-health); node-lost's
GPU 3 falls off the bus (derived-8gpu-lost); node-nvlink's two H200s ran an all-reduce over healthy links, and
node-busy's H100 bf16 products at its power cap: both good."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from backfill import openmetrics, replayed
from conftest import trace
from helpers import REPO, backfilled_prometheus

from gpuwarden.health.rules import RULES

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.xdist_group("quality_e2e"),  # one worker builds the module's stack, not each (--dist loadgroup)
    pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None, reason="prometheus/promtool not installed"),
]
NODES = {"node-health:10400": "derived-h100-health", "node-lost:10400": "derived-8gpu-lost",
         "node-nvlink:10400": "h200x2-nvlink", "node-busy:10400": "h100-compute_bound"}  # fmt: skip
WANTED = ("gpu_up", "gpu_xid_errors_total", "gpu_ecc_errors_total", "gpu_row_remap_pending", "gpu_row_remap_failure",
          "gpu_nvlink_link_up", "gpu_nvlink_link_errors_total", "gpu_fabric_state", "gpu_fabric_health_problem",
          "gpu_pcie_replay_errors_total", "gpu_pcie_link_width", "gpu_pcie_link_max_width",
          "gpu_clock_event_reason_seconds_total", "gpu_devices", "gpu_diagnosis", "gpu_process_job_info",
          *(s.metric for rule in RULES for s in rule.when.series_read()))  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("quality")
    end = time.time() - 30
    series = [replayed(trace(name), {"instance": inst, "job": "gpuwarden"}, end - 3600, 3600, wanted=WANTED,
                       node_name=inst.split(":")[0]) for inst, name in NODES.items()]  # fmt: skip
    with backfilled_prometheus(PROMETHEUS, PROMTOOL, tmp, openmetrics(*series)) as url:
        yield {"url": url, "end": end}


def gw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwarden", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, check=False, env={**os.environ, "COLUMNS": "200"})  # fmt: skip


def test_each_gpu_gets_its_tier_and_reasons(stack: dict) -> None:
    res = gw(
        "top", "--quality", "--json", "--prometheus", stack["url"], "--range", "55m", "--at", f"{stack['end']:.3f}"
    )
    assert res.returncode == 0, res.stderr
    gpus = {(g["instance"].split(":")[0], g["gpu"]): g for g in json.loads(res.stdout)["gpus"]}
    health = gpus[("node-health", "0")]
    assert health["tier"] == "service" and health["score"] < 0.25
    said = " ".join(r["reason"] for r in health["reasons"])
    assert "uncorrectable ECC error" in said and "row remap waits" in said and "XID 63" in said
    assert "within 5 °C of its own slowdown" in said  # 87 °C, its slowdown 89 °C: the page's condition held
    lost = " ".join(r["reason"] for r in gpus[("node-lost", "3")]["reasons"])
    assert gpus[("node-lost", "3")]["tier"] == "service" and "XID 79" in lost  # and its gpu_up 0, where a scrape saw it
    assert {gpus[("node-lost", str(i))]["tier"] for i in range(8) if i != 3} == {"good"}
    for key in (("node-nvlink", "0"), ("node-nvlink", "1"), ("node-busy", "0")):
        assert gpus[key]["tier"] == "good" and gpus[key]["score"] == 1.0, gpus[key]
    order = [g["score"] for g in json.loads(res.stdout)["gpus"]]
    assert order == sorted(order)  # worst first


def test_the_gpus_that_need_service_as_a_slurm_exclude_list_and_a_table(stack: dict) -> None:
    res = gw("top", "--quality", "--format", "slurm", "--prometheus", stack["url"], "--range", "55m",
             "--at", f"{stack['end']:.3f}")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "# gpuwarden GPUs that need service over the last 55m" in res.stdout
    drain = next(line for line in res.stdout.splitlines() if line.startswith("scontrol"))
    assert sorted(drain.split()[2].removeprefix("NodeName=").split(",")) == ["node-health", "node-lost"]
    assert drain.endswith('State=DRAIN Reason="gpuwarden: a GPU needs service"')
    assert "node-nvlink" not in res.stdout and "node-busy" not in res.stdout
    table = gw("top", "--quality", "--prometheus", stack["url"], "--range", "55m", "--at", f"{stack['end']:.3f}")
    rows = table.stdout.splitlines()
    assert rows[0].startswith("# GPU quality across jobs, last 55m: 2 to look at, 10 good")  # of 12 GPUs
    assert sorted(r.split("\t")[:3] for r in rows[2:] if r) == [
        ["node-health", "0", "service"],
        ["node-lost", "3", "service"],
    ]

"""The GPU that is different from the rest of its job, at a job's scale: a 144-GPU Slurm job on 36 nodes (4 GPUs
each) through the shipped rules (promtool) and the shipped routes and inhibitions (a real Alertmanager). One GPU
whose clocks are held down while the other 143 run at full speed is one page naming it (GpuThrottledAloneInJob),
and its own slowdown and heat tickets are muted by it; a job whose GPUs are all held down (a hot room) gets no such
page, nor a GPU at its power cap alone (the workload's), nor a job of three GPUs, nor a GPU among more than a few
held down at once."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, backfilled_prometheus, notifications, promtool_alerts

PROMTOOL = shutil.which("promtool")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")]
NODES, PER_NODE = 36, 4
MINUTES = 25
NAMES = ["GpuThrottledAloneInJob", "GpuHotterThanItsJob", "GpuHardwareSlowdown", "GpuThermalSlowdown"]


def _gpus(nodes: int = NODES) -> list[tuple[str, str, str]]:
    return [(f"gpu-node-{n:02d}:10400", str(g), f"GPU-{n:02d}{g}") for n in range(nodes) for g in range(PER_NODE)]


def _series(throttled: dict[str, str], hot: set[str], nodes: int = NODES) -> list[dict[str, str]]:
    """Every GPU held by Slurm job 9001 of alice, up, at 50-53 °C; ``throttled``: uuid -> the clock event reason
    active on that GPU from minute 0 on (its seconds counter grows 60 a minute, the flag reads 1); ``hot``: GPUs at
    72 °C."""
    out = []
    for i, (inst, gpu, uuid) in enumerate(_gpus(nodes)):
        labels = f'instance="{inst}",job="gpuwarden",gpu="{gpu}",uuid="{uuid}"'
        out.append({"series": f'gpu_process_job_info{{{labels},pid="{1000 + i}",job_id="9001",job_kind="slurm",'
                              f'job_scope="cluster",container_id="",user="alice",process_name="python3"}}',
                    "values": f"1+0x{MINUTES}"})  # fmt: skip
        out.append({"series": f"gpu_up{{{labels}}}", "values": f"1+0x{MINUTES}"})
        temp = 72 if uuid in hot else 50 + i % 4
        out.append({"series": f"gpu_temperature_celsius{{{labels}}}", "values": f"{temp}+0x{MINUTES}"})
        if uuid in throttled:
            reason = f'{labels},reason="{throttled[uuid]}"'
            out.append({"series": f"gpu_clock_event_reason_seconds_total{{{reason}}}", "values": f"0+60x{MINUTES}"})
            out.append({"series": f"gpu_clock_event_reason_active{{{reason}}}", "values": f"1+0x{MINUTES}"})
    return out


def _alerts(tmp: Path, series: list[dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    assert PROMTOOL is not None
    tmp.mkdir(exist_ok=True)
    rules = REPO / "alerts" / "tests" / "bare.rules.yml"
    return promtool_alerts(PROMTOOL, tmp, rules, series, NAMES, eval_time=f"{MINUTES - 1}m")


def test_one_gpu_of_144_held_down_for_heat_pages_once_and_its_tickets_are_muted(tmp_path: Path) -> None:
    lone = _gpus()[77][2]
    got = _alerts(tmp_path, _series({lone: "hw_thermal_slowdown"}, {lone}))
    assert [(a["uuid"], a["severity"], a["job_id"], a["user"]) for a in got["GpuThrottledAloneInJob"]] == [
        (lone, "critical", "9001", "alice")]  # fmt: skip
    # the GPU's own alerts fire as before: each a ticket of its own
    assert {n: [a["uuid"] for a in got[n]] for n in NAMES[1:]} == {
        "GpuHotterThanItsJob": [lone], "GpuHardwareSlowdown": [], "GpuThermalSlowdown": [lone]}  # fmt: skip
    if ALERTMANAGER is None:
        pytest.skip("alertmanager not installed")
    fired = [a for n in NAMES for a in got[n]]
    before = notifications(ALERTMANAGER, tmp_path / "before", [a for a in fired if a["severity"] != "critical"])
    after = notifications(ALERTMANAGER, tmp_path / "after", fired)
    assert [recv for recv, _ in before] == ["tickets"]  # one ticket for the node, its two alerts
    assert after == [("pager", ["GpuThrottledAloneInJob"])]


def test_a_hot_room_a_power_cap_a_small_job_and_a_throttled_few_get_no_outlier_page(tmp_path: Path) -> None:
    every = {uuid: "hw_thermal_slowdown" for *_, uuid in _gpus()}
    assert _alerts(tmp_path / "every", _series(every, set()))["GpuThrottledAloneInJob"] == []
    # one GPU at its power cap while the others are not: the workload's power, and its silicon, not a fault
    capped = {_gpus()[77][2]: "sw_power_cap"}
    assert _alerts(tmp_path / "capped", _series(capped, set()))["GpuThrottledAloneInJob"] == []
    small = [s for s in _series({"GPU-000": "hw_slowdown"}, set(), nodes=1) if 'uuid="GPU-003"' not in s["series"]]
    assert _alerts(tmp_path / "small", small)["GpuThrottledAloneInJob"] == []
    # 15 of 144 (over a tenth) held down: the job's load or the site's power, not one GPU
    few = {uuid: "hw_power_brake_slowdown" for *_, uuid in _gpus()[::10]}
    assert len(few) == 15 and _alerts(tmp_path / "few", _series(few, set()))["GpuThrottledAloneInJob"] == []
    # 14 of 144 (under a tenth): each its job's straggler
    fewer = dict(list(few.items())[:14])
    assert len(_alerts(tmp_path / "fewer", _series(fewer, set()))["GpuThrottledAloneInJob"]) == 14


PROMETHEUS = shutil.which("prometheus")


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed")
def test_top_quality_names_the_gpu_apart_from_its_job(tmp_path: Path) -> None:
    """An hour of an 8-GPU Slurm job on two nodes (synthetic series, every 15 s) whose GPU 1 of node b is held down for
    heat and runs 25 °C above the others for its last 30 minutes, beside a 4-GPU job whose GPUs are all power
    capped: ``top --quality`` gives that GPU the two outlier reasons (watch), and no GPU of the capped job either."""
    assert PROMETHEUS is not None and PROMTOOL is not None
    end = time.time() - 60
    start = end - 3600
    series: dict[tuple[str, str], list[tuple[float, str]]] = {}
    gpus = [(f"node-{n}:10400", str(g), f"GPU-{n}{g}", "9001") for n in "ab" for g in range(4)]
    gpus += [("node-c:10400", str(g), f"GPU-c{g}", "9002") for g in range(4)]
    for inst, gpu, uuid, job in gpus:
        labels = f'instance="{inst}",job="gpuwarden",gpu="{gpu}",uuid="{uuid}"'
        info = f'{labels},pid="1{gpu}",job_id="{job}",job_kind="slurm",job_scope="cluster",user="alice"'
        lone, capped = uuid == "GPU-b1", job == "9002"
        for i in range(241):
            t = start + 15 * i
            late = t >= start + 1800
            series.setdefault(("gpu_up", labels), []).append((t, "1"))
            series.setdefault(("gpu_process_job_info", info), []).append((t, "1"))
            series.setdefault(("gpu_temperature_celsius", labels), []).append((t, "75" if lone and late else "50"))
            if lone or capped:
                reason = "sw_power_cap" if capped else "hw_thermal_slowdown"
                held = 15 * i if capped else max(0.0, t - start - 1800)
                series.setdefault(("gpu_clock_event_reason_seconds_total", f'{labels},reason="{reason}"'), []).append(
                    (t, f"{held:g}"))  # fmt: skip
    om = "\n".join(f"{n}{{{lab}}} {v} {t:.3f}" for (n, lab), pts in sorted(series.items()) for t, v in pts)
    with backfilled_prometheus(PROMETHEUS, PROMTOOL, tmp_path, om + "\n# EOF\n") as url:
        res = subprocess.run([sys.executable, "-m", "gpuwarden", "top", "--quality", "--json", "--prometheus", url,
                              "--range", "55m", "--at", f"{end:.3f}"], capture_output=True, text=True, cwd=REPO,
                             timeout=300, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    got = {g["uuid"]: g for g in json.loads(res.stdout)["gpus"]}
    said = [r["reason"] for r in got["GPU-b1"]["reasons"]]
    assert got["GPU-b1"]["tier"] == "watch", said
    # beside the node-peer reason the clock events give (the other GPUs of node b: 0 s), the job's two, 25-30 min each
    assert said[0] == "1800 s of clock event hw_thermal_slowdown (the node's other GPUs: 0 s)"
    assert said[1].startswith("clocks held down while the other GPUs of its job ran at full speed: 2")
    assert said[2].startswith("15 °C or more above the median of its job's GPUs: 30m")
    assert len(said) == 3
    assert {u: g["tier"] for u, g in got.items() if u != "GPU-b1"} == {u: "good" for *_, u, _ in gpus if u != "GPU-b1"}

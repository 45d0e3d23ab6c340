"""Application XIDs at a job's scale: a 144-GPU Slurm job on 36 nodes (4 GPUs each), through the shipped rules
(promtool) and the shipped routes (a real Alertmanager): every GPU reporting XID 31 is one notice to the job's owner,
not one per node; one GPU reporting XID 13 while the other 143 report nothing is one ticket naming that GPU and the
comparison; the same GPU reporting XID 48 besides pages (GpuCriticalXid), a fault of the GPU whatever its job."""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from helpers import REPO, alertmanager, promtool_alerts, shipped_routes, webhook

PROMTOOL = shutil.which("promtool")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")]
NODES, PER_NODE = 36, 4


def _gpus() -> list[tuple[str, str, str]]:
    return [(f"gpu-node-{n:02d}:10400", str(g), f"GPU-{n:02d}{g}") for n in range(NODES) for g in range(PER_NODE)]


def _series(xids: dict[str, int]) -> list[dict[str, str]]:
    """Every GPU held by Slurm job 9001 of alice, up; ``xids``: uuid -> an XID code that GPU reported at 1m."""
    out = []
    for i, (inst, gpu, uuid) in enumerate(_gpus()):
        labels = f'instance="{inst}",job="gpuwarden",gpu="{gpu}",uuid="{uuid}"'
        out.append({"series": f'gpu_process_job_info{{{labels},pid="{1000 + i}",job_id="9001",job_kind="slurm",'
                              f'job_scope="cluster",container_id="",user="alice",process_name="python3"}}',
                    "values": "1+0x10"})  # fmt: skip
        out.append({"series": f"gpu_up{{{labels}}}", "values": "1+0x10"})
        if uuid in xids:
            out.append({"series": f'gpu_xid_last_event_timestamp_seconds{{{labels},xid="{xids[uuid]}"}}',
                        "values": "_ 60+0x9"})  # fmt: skip
    return out


def _alerts(tmp: Path, xids: dict[str, int], names: list[str]) -> dict[str, list[dict[str, str]]]:
    """The alerts ``names`` firing at 5m over the shipped rules (bare.rules.yml), by name."""
    assert PROMTOOL is not None
    return promtool_alerts(PROMTOOL, tmp, REPO / "alerts" / "tests" / "bare.rules.yml", _series(xids), names)


def test_every_gpu_of_a_144_gpu_job_reporting_xid_31_is_one_notice_to_its_owner(tmp_path: Path) -> None:
    got = _alerts(tmp_path, {uuid: 31 for *_, uuid in _gpus()}, ["GpuJobApplicationXid", "GpuApplicationXidOutlier",
                                                                  "GpuCriticalXid", "GpuXidErrors"])  # fmt: skip
    assert got["GpuJobApplicationXid"] == [{"alertname": "GpuJobApplicationXid", "job_id": "9001",
                                            "job_kind": "slurm", "notify": "owner", "severity": "info",
                                            "user": "alice"}]  # fmt: skip
    assert got["GpuApplicationXidOutlier"] == [] and got["GpuCriticalXid"] == [] and got["GpuXidErrors"] == []


def test_one_gpu_of_the_144_reporting_xid_13_is_one_ticket_for_it_and_xid_48_a_page(tmp_path: Path) -> None:
    lone = _gpus()[77][2]
    got = _alerts(tmp_path, {lone: 13}, ["GpuJobApplicationXid", "GpuApplicationXidOutlier"])
    assert got["GpuJobApplicationXid"] == []
    assert [(a["instance"], a["gpu"], a["uuid"], a["job_id"]) for a in got["GpuApplicationXidOutlier"]] == [
        ("gpu-node-19:10400", "1", lone, "9001")]  # fmt: skip
    got = _alerts(tmp_path, {lone: 48}, ["GpuCriticalXid", "GpuApplicationXidOutlier"])
    assert [(a["uuid"], a["xid"], a["severity"]) for a in got["GpuCriticalXid"]] == [(lone, "48", "critical")]
    assert got["GpuApplicationXidOutlier"] == []  # 48 is the GPU's (critical), not an application's


@pytest.mark.skipif(ALERTMANAGER is None, reason="alertmanager not installed")
def test_the_shipped_routes_send_the_jobs_notice_once_to_its_owner(tmp_path: Path) -> None:
    """The notice the rules give (above) posted to a real Alertmanager with the shipped routes, beside what a per-node
    alert of the same job would have been (36 of them, one per node): the owner's receiver gets one notification."""
    assert ALERTMANAGER is not None
    end = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    notice = {"alertname": "GpuJobApplicationXid", "severity": "info", "notify": "owner", "job_id": "9001",
              "job_kind": "slurm", "user": "alice"}  # fmt: skip
    with webhook() as hook, alertmanager(ALERTMANAGER, tmp_path, shipped_routes(hook.port, "1s")) as am:
        posted = httpx.post(f"{am}/api/v2/alerts", json=[{"labels": notice, "annotations": {}, "endsAt": end}],
                            timeout=10)  # fmt: skip
        assert posted.status_code == 200
        deadline = time.monotonic() + 60
        while not hook.got:
            assert time.monotonic() < deadline, "no notification"
            time.sleep(0.2)
        time.sleep(3)  # a second notification would come within the group's wait: none does
    assert [(recv, len(body["alerts"])) for recv, _, body in hook.got] == [("owners", 1)]

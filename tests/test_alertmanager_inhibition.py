"""The shipped inhibitions in a real Alertmanager: alerts posted to its API, then read back with their
``status.inhibitedBy``. One fault mutes its own consequences, and never an unrelated alert that merely lacks the
same labels (Alertmanager treats a label missing on both sides as equal)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml
from helpers import REPO, alertmanager, free_port

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(ALERTMANAGER is None, reason="alertmanager not installed (.ci/run installs Debian's)"),
]


@pytest.fixture(scope="module")
def am(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("am")
    cfg = yaml.safe_load((REPO / "gpuwarden" / "mixin" / "alertmanager.yml").read_text())
    for r in cfg["receivers"]:  # nothing is delivered: a closed port
        r["webhook_configs"] = [{"url": f"http://127.0.0.1:{free_port()}/", "send_resolved": False}]
    with alertmanager(ALERTMANAGER, tmp, cfg) as url:
        yield url


def _post(am: str, *alerts: dict[str, str]) -> None:
    end = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    body = [{"labels": a, "annotations": {}, "endsAt": end} for a in alerts]
    assert httpx.post(f"{am}/api/v2/alerts", json=body, timeout=10).status_code == 200


def _inhibited(am: str, alertname: str, **match: str) -> bool:
    """Whether the alert named ``alertname`` (with labels ``match``) is muted, once Alertmanager has it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for a in httpx.get(f"{am}/api/v2/alerts", timeout=10).json():
            labels = a["labels"]
            if labels["alertname"] == alertname and all(labels.get(k) == v for k, v in match.items()):
                if a["status"]["state"] != "unprocessed":
                    return bool(a["status"]["inhibitedBy"])
        time.sleep(0.3)
    raise AssertionError(f"{alertname} {match} never processed")


def test_a_missing_gpu_does_not_mute_an_unrelated_jobs_imbalance(am: str) -> None:
    _post(
        am,
        {"alertname": "GpuMissing", "severity": "critical", "nodename": "node-7", "instance": "10.0.0.7:10400"},
        {"alertname": "GpuMissing", "severity": "critical", "nodename": "node-6"},  # rules without its instance
        {"alertname": "GpuJobImbalancedAcrossNodes", "severity": "info", "job_id": "4242"},
    )
    assert not _inhibited(am, "GpuJobImbalancedAcrossNodes", job_id="4242")


def test_a_lost_gpu_mutes_its_own_alerts_only(am: str) -> None:
    gpu = {"instance": "10.0.0.8:10400", "uuid": "GPU-a", "gpu": "0"}
    _post(
        am,
        {"alertname": "GpuLost", "severity": "critical", **gpu},
        {"alertname": "GpuMemoryAlmostFull", "severity": "warning", **gpu},
        {"alertname": "GpuMemoryAlmostFull", "severity": "warning", **gpu, "uuid": "GPU-b", "gpu": "1"},
        {"alertname": "GpuStarved", "severity": "info", **gpu, "instance": "10.0.0.9:10400"},
    )
    assert _inhibited(am, "GpuMemoryAlmostFull", uuid="GPU-a")
    assert not _inhibited(am, "GpuMemoryAlmostFull", uuid="GPU-b")
    assert not _inhibited(am, "GpuStarved", instance="10.0.0.9:10400")


def test_a_daemon_down_mutes_its_node_and_not_the_cross_node_alerts(am: str) -> None:
    _post(
        am,
        {"alertname": "GpuwardenDown", "severity": "critical", "instance": "10.0.0.10:10400", "job": "gpuwarden"},
        {"alertname": "GpuwardenCollectionStale", "severity": "warning", "instance": "10.0.0.10:10400"},
        {"alertname": "GpuJobImbalancedAcrossNodes", "severity": "info", "job_id": "777"},
    )
    assert _inhibited(am, "GpuwardenCollectionStale", instance="10.0.0.10:10400")
    assert not _inhibited(am, "GpuJobImbalancedAcrossNodes", job_id="777")

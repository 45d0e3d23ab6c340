"""The shipped Alertmanager configuration: valid for amtool, and each kind of alert goes where docs/runbook.md says."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from helpers import REPO

AMTOOL = shutil.which("amtool")
CONFIG = REPO / "gpuwarden" / "mixin" / "alertmanager.yml"
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(AMTOOL is None, reason="amtool not installed (.ci/run installs Debian's alertmanager)"),
]


def test_amtool_check_config() -> None:
    res = subprocess.run([AMTOOL, "check-config", str(CONFIG)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["alertname=GpuLost", "severity=critical"], "pager"),
        (["alertname=GpuMemoryFillingUp", "severity=critical"], "pager"),
        (["alertname=GpuMemoryAlmostFull", "severity=warning"], "tickets"),
        (["alertname=GpuMemoryHeldIdle", "severity=warning", "notify=owner", "user=alice"], "owners"),
        # no owner to notify (a process gone from /proc: job "?/?"): a ticket, never a group keyed "?"
        (["alertname=GpuMemoryHeldIdle", "severity=warning", "notify=owner", "user=?", "job_id=?/?"], "tickets"),
        (["alertname=GpuMemoryHeldIdle", "severity=warning", "notify=owner"], "tickets"),
        (["alertname=GpuStarved", "severity=info"], "chat"),
        (["alertname=SomethingElse"], "tickets"),
    ],
)
def test_routes(labels: list[str], receiver: str) -> None:
    res = subprocess.run(
        [AMTOOL, "config", "routes", "test", f"--config.file={CONFIG}", f"--verify.receivers={receiver}", *labels],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert res.returncode == 0 and res.stdout.strip() == receiver, res.stdout + res.stderr

"""One incident for what fails together, through the shipped rules (promtool) and the shipped routes and inhibitions
(a real Alertmanager, its receivers one local webhook): an NVL72-shaped NVLink domain (18 nodes x 4 GPUs, one fabric
cluster UUID and clique) whose fabric reports a health problem on every GPU, and a row of 8 nodes (a ``row`` target
label) whose GPUs all slow their clocks for heat. The rules give the unit's alert and, as before, each GPU's (every
one carrying its unit); the routes turn them into one notification, where the GPUs' alerts alone are one per node."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import REPO, notifications, promtool_alerts

PROMTOOL = shutil.which("promtool")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(PROMTOOL is None or ALERTMANAGER is None, reason="promtool/alertmanager not installed"),
]
DOMAIN = "c0ffee00-0000-4000-8000-000000000072"


def _domain() -> list[dict[str, str]]:
    out = []
    for n in range(18):
        for g in range(4):
            labels = f'instance="nvl-{n:02d}:10400",job="gpuwarden",gpu="{g}",uuid="GPU-{n:02d}{g}"'
            out += [
                {"series": f"gpu_up{{{labels}}}", "values": "1+0x25"},
                {
                    "series": f'gpu_fabric_info{{{labels},clique_id="3",cluster_uuid="{DOMAIN}",'
                    'health_summary="unhealthy",status="success"}',
                    "values": "1+0x25",
                },  # fmt: skip
                {"series": f'gpu_fabric_health_problem{{{labels},check="route_unhealthy"}}', "values": "1+0x25"},
            ]
    return out


def test_a_domain_wide_fabric_problem_is_one_notification_not_one_per_node(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    got = promtool_alerts(PROMTOOL, tmp_path, REPO / "alerts" / "gpuwarden.rules.yml", _domain(),
                          ["GpuFabricUnhealthy", "GpuNvlinkDomainUnhealthy"], eval_time="17m")  # fmt: skip
    gpus, domain = got["GpuFabricUnhealthy"], got["GpuNvlinkDomainUnhealthy"]
    assert len(gpus) == 72 and {a["nvlink_domain"] for a in gpus} == {f"{DOMAIN}/3"}
    assert [(a["nvlink_domain"], a["severity"]) for a in domain] == [(f"{DOMAIN}/3", "warning")]
    before = notifications(ALERTMANAGER, tmp_path / "before", gpus)  # the GPUs' alerts alone, as the rules gave before
    after = notifications(ALERTMANAGER, tmp_path / "after", gpus + domain)
    print(f"notifications: {len(before)} without the domain's alert, {len(after)} with it")
    assert len(before) == 18 and all(recv == "tickets" for recv, _ in before)
    assert after == [("tickets", ["GpuNvlinkDomainUnhealthy"])]


def _row() -> list[dict[str, str]]:
    out = []
    for n in range(8):
        for g in range(4):
            labels = f'instance="r7-{n}:10400",job="gpuwarden",gpu="{g}",uuid="GPU-7{n}{g}",row="r7"'
            out += [
                {"series": f"gpu_up{{{labels}}}", "values": "1+0x25"},
                {
                    "series": f'gpu_clock_event_reason_active{{{labels},reason="sw_thermal_slowdown"}}',
                    "values": "1+0x25",
                },  # fmt: skip
            ]
    return out


def test_a_row_slowing_for_heat_together_is_one_page_not_one_ticket_per_node(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    got = promtool_alerts(PROMTOOL, tmp_path, REPO / "alerts" / "gpuwarden.rules.yml", _row(),
                          ["GpuThermalSlowdown", "GpuSiteUnitHot"], eval_time="12m")  # fmt: skip
    gpus, row = got["GpuThermalSlowdown"], got["GpuSiteUnitHot"]
    assert len(gpus) == 32 and {a["row"] for a in gpus} == {"r7"}
    assert [(a["row"], a["unit"], a["severity"]) for a in row] == [("r7", "row", "critical")]
    before = notifications(ALERTMANAGER, tmp_path / "before", gpus)
    after = notifications(ALERTMANAGER, tmp_path / "after", gpus + row)
    print(f"notifications: {len(before)} without the row's alert, {len(after)} with it")
    assert len(before) == 8 and all(recv == "tickets" for recv, _ in before)
    assert after == [("pager", ["GpuSiteUnitHot"])]

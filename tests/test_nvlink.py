"""NVLink links and fabric (gpuwarden.nvml.nvlink, gpuwarden.collectors.nvlink): the real NVML layer over a fake NVML
that answers from the 2x H200 recording of an all-reduce (tests/data/traces/h200x2-nvlink.jsonl.gz), the fabric's
health mask decoded, and the series."""

from __future__ import annotations

import dataclasses

import pynvml
import pytest
from conftest import render, replay_poller, trace
from fake_nvml import FakeNvml
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.model import FabricReading, GpuReading, PollResult
from gpuwarden.nvml import source as nvml_source
from gpuwarden.nvml.nvlink import fabric_reading
from gpuwarden.nvml.source import NvmlSource
from gpuwarden.poller import Poller

NVLINK = trace("h200x2-nvlink")


def _series(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    monkeypatch.setattr(nvml_source, "RETRY_FIRST_SECONDS", 0.05)
    return FakeNvml(NVLINK).install(monkeypatch)


def test_every_link_and_its_counters_are_read_where_nvml_has_no_totals(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML has no CRC total on these H200s (the total fields answered NOT_SUPPORTED there: tools/nvlink_probe.py):
    the daemon reads each link's counters and says nothing of NVLink errors is missing; it does not sum totals from
    them (their CRC data errors grow under traffic on a healthy link)."""
    totals = {
        pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    }
    answer = fake.nvmlDeviceGetFieldValues

    def as_on_the_h200(handle: object, ids: list) -> object:
        values = answer(handle, ids)
        for fv in values:
            if fv.fieldId in totals:
                fv.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", as_on_the_h200)
    live = Poller(NvmlSource(gpm_interval=0.0), 1.0)  # type: ignore[arg-type]
    live.start(thread=False)
    live.poll_once()
    assert live.snapshot is not None and live.snapshot.poll is not None
    g = live.snapshot.poll.gpus[1]
    assert len(g.nvlink_link_up) == 18 and set(g.nvlink_link_up.values()) == {1}
    kinds = {k.partition(":")[2] for k in g.nvlink_link_errors_total}
    assert kinds == {"replay", "recovery", "crc_flit", "crc_data", "ecc_data"}
    assert sum(v for k, v in g.nvlink_link_errors_total.items() if k.endswith(":crc_data")) > 0
    assert g.nvlink_errors_total == {}
    assert not [n for n in g.unsupported if n.startswith("nvlink")], g.unsupported
    assert fake.calls["nvmlDeviceGetNvLinkErrorCounter"] >= 2 * 18 * 5
    assert g.fabric is not None and g.fabric.state == "completed" and g.fabric.status == "success"
    text = render(live.snapshot)
    errors = _series(text, "gpu_nvlink_link_errors_total")
    counted = sum(1 for gpu in live.snapshot.poll.gpus for v in gpu.nvlink_link_errors_total.values() if v)
    assert len(errors) == counted and 0 < counted < 2 * 18 * 5  # a counter still at 0 has no series
    assert all(v > 0 for v in errors.values())
    assert _series(text, "gpu_fabric_state")[(("gpu", "0"), ("state", "completed"),
                                                ("uuid", live.snapshot.poll.gpus[0].uuid))] == 1.0  # fmt: skip


def test_the_live_daemon_serves_the_link_series_the_replay_does(fake: FakeNvml) -> None:
    live = Poller(NvmlSource(gpm_interval=0.0), 1.0)  # type: ignore[arg-type]
    live.start(thread=False)
    for _ in range(3):
        live.poll_once()
    replay = replay_poller(NVLINK, 4)
    for name in ("gpu_nvlink_link_up", "gpu_nvlink_link_errors_total", "gpu_fabric_state", "gpu_fabric_info"):
        assert _series(render(live.snapshot), name) == _series(render(replay.snapshot), name), name


def test_a_link_counter_nvml_does_not_have_is_asked_once(fake: FakeNvml) -> None:
    """Blackwell's per-link counters answer NOT_SUPPORTED on Hopper: asked at the first read, never again."""
    live = Poller(NvmlSource(gpm_interval=0.0, slow_interval=1.0), 1.0)  # type: ignore[arg-type]
    live.start(thread=False)
    first = fake.calls["nvmlDeviceGetFieldValues"]
    assert first >= 2 * 18  # the first slow read asked each GPU's 18 links, one batch each
    for _ in range(3):
        live.poll_once()
    later = fake.calls["nvmlDeviceGetFieldValues"] - first
    assert later <= 3 * 2 * 2  # since: each GPU's poll and slow batches only, no per-link batch


@pytest.mark.parametrize(
    ("mask", "expected"),
    [
        (0, {}),  # nothing supported (the H200s recorded)
        (2 << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW, {"degraded_bandwidth": False}),
        (
            (1 << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY)
            | (2 << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY)
            | (1 << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY),
            {"route_recovery": True, "route_unhealthy": False, "access_timeout_recovery": True},
        ),
    ],
)
def test_the_fabric_health_mask_is_decoded_check_by_check(mask: int, expected: dict[str, bool]) -> None:
    f = fabric_reading(3, 0, 7, bytes(range(16)), mask, 3)
    assert f.health == expected
    assert (f.state, f.status, f.clique_id, f.health_summary) == ("completed", "success", 7, "limited_capacity")
    assert f.cluster_uuid == "00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert fabric_reading(1, pynvml.NVML_ERROR_NOT_READY, 0, bytes(16), 0, 0).status == "not_ready"


def test_a_fabric_that_never_came_up_and_an_unhealthy_one_are_served() -> None:
    from conftest import snapshot

    snap = snapshot(NVLINK, 3)
    assert snap.poll is not None
    gpus = [
        g.model_copy(update={"fabric": FabricReading(state="in_progress", status="success",
                                                     health={"route_unhealthy": True, "degraded_bandwidth": False})})
        for g in snap.poll.gpus
    ]  # fmt: skip
    poll: PollResult = snap.poll.model_copy(update={"gpus": gpus})
    text = render(dataclasses.replace(snap, poll=poll))
    states = {dict(k)["state"]: v for k, v in _series(text, "gpu_fabric_state").items() if dict(k)["gpu"] == "0"}
    assert states == {"in_progress": 1.0}  # the state it is in; the others have no series
    problems = _series(text, "gpu_fabric_health_problem")
    health = {dict(k)["check"]: v for k, v in problems.items() if dict(k)["gpu"] == "1"}
    assert health == {"route_unhealthy": 1.0, "degraded_bandwidth": 0.0}
    assert isinstance(gpus[0], GpuReading)

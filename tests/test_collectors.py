"""Collectors over real recorded traces: the right families, the right values, nothing invented."""

from __future__ import annotations

import math
import subprocess

import pytest
from conftest import H100_SCENARIOS, render, snapshot, trace
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.catalog import COLLECTORS, select_collectors
from gpuwarden.collectors import CollectOptions, registry
from gpuwarden.exposition import Exposition
from gpuwarden.snapshot import Held
from gpuwarden.trace import read_trace


def families(text: str) -> dict[str, list]:
    """Family name -> samples, parsed by prometheus_client's own parser."""
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(fams: dict, name: str, **labels: str) -> float:
    for s in fams[name]:
        if s.name.removesuffix("_total") == name.removesuffix("_total") and all(
            s.labels.get(k) == v for k, v in labels.items()
        ):
            return s.value
    raise KeyError((name, labels))


@pytest.fixture(scope="module")
def compute() -> dict:
    return families(render(snapshot(trace("h100-compute_bound"), polls=10)))


def test_compute_bound_shows_busy_gpu_tensor_work_and_power_cap(compute: dict) -> None:
    assert value(compute, "gpu_utilization_ratio", gpu="0") > 0.9
    assert value(compute, "gpu_sm_activity_ratio", gpu="0") > 0.8
    assert value(compute, "gpu_tensor_activity_ratio", gpu="0") > 0.8
    assert value(compute, "gpu_clock_event_reason_active", reason="sw_power_cap") == 1.0
    with pytest.raises(KeyError):  # a reason that does not hold has no series
        value(compute, "gpu_clock_event_reason_active", reason="gpu_idle")
    assert value(compute, "gpu_power_usage_watts") > 500
    assert value(compute, "gpu_clock_event_reason_seconds", reason="sw_power_cap") > 0


def test_every_per_gpu_series_carries_gpu_and_uuid(compute: dict) -> None:
    uuid = read_trace(trace("h100-compute_bound"))[0].node.gpus[0].uuid
    for name, samples in compute.items():
        if not name.startswith("gpu_") or name in ("gpu_driver_info", "gpu_devices"):
            continue
        for s in samples:
            assert s.labels.get("gpu") == "0" and s.labels.get("uuid") == uuid, (name, s)


def test_unsupported_readings_are_absent_not_zero(compute: dict) -> None:
    # The H100 PCIe card has no fan reading and no NVLink: no series at all, never a 0.
    assert "gpu_fan_speed_ratio" not in compute
    assert "gpu_nvlink_receive_bytes_per_second" not in compute
    for name, samples in compute.items():
        for s in samples:
            assert not math.isnan(s.value), name
            assert s.value < 1e18, (name, s)  # no NVML sentinel such as 2**64-1


def test_nvlink_is_exported_where_the_gpus_have_it() -> None:
    fams = families(render(snapshot(trace("h200x2-ddp_straggler"), polls=5)))
    gpus = {s.labels["gpu"] for s in fams["gpu_nvlink_receive_bytes_per_second"]}
    assert gpus == {"0", "1"}


def test_ddp_straggler_shows_util_and_sm_activity_disagree() -> None:
    fams = families(render(snapshot(trace("h200x2-ddp_straggler"), polls=15)))
    # rank 0 waits in the all-reduce: a kernel is "running" while few SMs work
    assert value(fams, "gpu_utilization_ratio", gpu="0") > 0.5
    assert value(fams, "gpu_sm_activity_ratio", gpu="0") < 0.5


def test_held_idle_shows_memory_held_and_the_process() -> None:
    fams = families(render(snapshot(trace("h100-held_idle"), polls=5)))
    assert value(fams, "gpu_memory_used_bytes") > 50e9
    assert value(fams, "gpu_compute_processes") == 1
    [proc] = fams["gpu_process_memory_used_bytes"]
    assert proc.labels["process_name"] == "python3"
    assert proc.value > 50e9


def test_process_series_are_bounded() -> None:
    snap = snapshot(trace("h200x2-ddp_straggler"), polls=3)
    text = Exposition(Held(snap), select_collectors(), CollectOptions(max_processes_per_gpu=1)).render().decode()
    per_gpu: dict[str, int] = {}
    for s in families(text)["gpu_process_memory_used_bytes"]:
        per_gpu[s.labels["gpu"]] = per_gpu.get(s.labels["gpu"], 0) + 1
    assert per_gpu == {"0": 1, "1": 1}
    assert value(families(text), "gpu_compute_processes", gpu="0") == 2  # the count still counts all


def test_idle_gpu_is_idle() -> None:
    fams = families(render(snapshot(trace("h100-idle"), polls=5)))
    assert value(fams, "gpu_utilization_ratio") == 0
    assert value(fams, "gpu_clock_event_reason_active", reason="gpu_idle") == 1
    assert value(fams, "gpu_compute_processes") == 0
    assert "gpu_process_memory_used_bytes" not in fams


def test_thresholds_come_from_the_card() -> None:
    fams = families(render(snapshot(trace("h100-idle"), polls=1), enable=("detail",)))
    assert value(fams, "gpu_temperature_threshold_celsius", threshold="slowdown") == 89
    assert value(fams, "gpu_clock_max_hertz", clock="sm") == 1980e6


def test_disabled_collector_is_gone_and_self_metrics_report_collectors() -> None:
    snap = snapshot(trace("h100-idle"), polls=2)
    fams = families(render(snap, disable=("gpm", "processes")))
    assert "gpu_sm_activity_ratio" not in fams
    assert "gpu_compute_processes" not in fams
    collectors = {s.labels["collector"] for s in fams["gpuwarden_scrape_collector_success"]}
    assert collectors == {n for n, c in COLLECTORS.items() if c.enabled_by_default} - {"gpm", "processes"}
    assert all(s.value == 1 for s in fams["gpuwarden_scrape_collector_success"])


def test_failing_collector_is_reported_and_others_survive(monkeypatch: pytest.MonkeyPatch) -> None:
    real = registry.declared

    def broken(snap, fam):  # noqa: ANN001, ANN202
        if fam.collector == "memory":
            raise RuntimeError("boom")
        return real(snap, fam)

    monkeypatch.setattr(registry, "declared", broken)
    fams = families(render(snapshot(trace("h100-idle"), polls=1)))
    assert value(fams, "gpuwarden_scrape_collector_success", collector="memory") == 0
    assert value(fams, "gpuwarden_scrape_collector_success", collector="thermal") == 1
    assert "gpu_temperature_celsius" in fams and "gpu_memory_used_bytes" not in fams


def test_lost_gpu_goes_down_and_its_readings_disappear() -> None:
    snap = snapshot(trace("h200x2-ddp_straggler"), polls=2)
    assert snap.poll is not None
    lost = snap.poll.gpus[1].model_copy(update={"up": False, "error": "gpu_is_lost"})
    snap.poll.gpus[1] = lost
    fams = families(render(snap))
    assert value(fams, "gpu_up", gpu="0") == 1 and value(fams, "gpu_up", gpu="1") == 0
    assert {s.labels["gpu"] for s in fams["gpu_utilization_ratio"]} == {"0"}


@pytest.mark.e2e
@pytest.mark.parametrize("name", H100_SCENARIOS + ["h200x2-ddp_straggler"])
def test_promtool_check_metrics_finds_nothing(name: str, promtool: str) -> None:
    path = trace(name if name.startswith("h200") else f"h100-{name}")
    text = render(snapshot(path, polls=5))
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res.stdout + res.stderr


def test_exposition_is_rendered_once_per_snapshot() -> None:
    snap = snapshot(trace("h100-idle"), polls=1)
    exp = Exposition(Held(snap), select_collectors(), CollectOptions())
    assert exp.render() is exp.render()


def test_gpu_hour_price_is_exported_only_when_configured() -> None:
    snap = snapshot(trace("h100-held_idle"), polls=3)
    priced = Exposition(Held(snap), select_collectors(), CollectOptions(price_per_gpu_hour=2.5, currency="EUR"))
    [price] = families(priced.render().decode())["gpuwarden_gpu_hour_price"]
    assert price.labels == {"currency": "EUR", "model": "NVIDIA H100 80GB HBM3"} and price.value == 2.5
    assert "gpuwarden_gpu_hour_price" not in families(render(snap))


def test_each_model_is_priced_from_the_table_and_any_other_at_the_default() -> None:
    snap = snapshot(trace("h100-held_idle"), polls=3)
    model = snap.static.gpus[0].name
    table = CollectOptions(gpu_hour_prices={model: 3.25, "Tesla T4": 0.35}, currency="USD")
    [price] = families(Exposition(Held(snap), select_collectors(), table).render().decode())["gpuwarden_gpu_hour_price"]
    assert (price.labels["model"], price.value) == (model, 3.25)  # only the node's own models are exported
    unlisted = CollectOptions(gpu_hour_prices={"Tesla T4": 0.35})  # and no default: the node's model is not priced
    assert "gpuwarden_gpu_hour_price" not in families(Exposition(Held(snap), select_collectors(), unlisted)
                                                      .render().decode())  # fmt: skip


def test_a_price_that_is_not_a_positive_number_is_refused() -> None:
    from gpuwarden.config import Config

    for bad in ({"price_per_gpu_hour": -1}, {"price_per_gpu_hour": "nan"}, {"currency": "dollars"},
                {"gpu_hour_prices": {"NVIDIA H200": 0}}, {"gpu_hour_prices": {"NVIDIA H200": "inf"}},
                {"gpu_hour_prices": {"": 1.0}}):  # fmt: skip
        with pytest.raises(ValueError, match="price_per_gpu_hour|currency|gpu_hour_prices"):
            Config(**bad)


SHARED = "h100-shared-slurm-env"  # two processes of Slurm job 777 on one H100 (tools/device-shared-gpu.sh)


def test_two_processes_sharing_a_gpu_get_their_own_utilization_within_the_devices() -> None:
    from gpuwarden.collectors.processes import process_shares
    from gpuwarden.trace import read_trace

    _, polls = read_trace(trace(SHARED))
    seen = 0
    for poll in polls:
        [g] = poll.gpus
        shares = process_shares(g)
        raw = [p.sm_utilization_ratio for p in g.processes or () if p.sm_utilization_ratio is not None]
        if len(shares) == 2:
            seen += 1
        # the invariant: the processes' (so the jobs') shares of a GPU never exceed the device's value
        assert sum(shares.values()) <= (g.utilization_gpu_ratio or 1.0) + 1e-9
        assert all(0 <= v <= r + 1e-9 for v, r in zip(sorted(shares.values()), sorted(raw), strict=True))
    assert seen >= len(polls) // 2
    fams = families(render(snapshot(trace(SHARED), polls=10)))
    # a process without a sample in the last interval (rank 1 pauses) has no series rather than a 0
    pids = {s.labels["pid"] for s in fams["gpu_process_sm_utilization_ratio"]}
    assert pids and pids <= {s.labels["pid"] for s in fams["gpu_process_memory_used_bytes"]}


def test_process_shares_never_exceed_the_device_and_keep_their_proportions() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    from gpuwarden.collectors.processes import process_shares
    from gpuwarden.model import GpuReading, ProcessReading

    ratio = st.floats(0, 1, allow_nan=False)

    @given(st.lists(st.one_of(st.none(), ratio), max_size=8), st.one_of(st.none(), ratio))
    def check(raw: list[float | None], device: float | None) -> None:
        procs = [ProcessReading(pid=i, sm_utilization_ratio=r) for i, r in enumerate(raw)]
        g = GpuReading(index=0, uuid="GPU-x", timestamp=1.0, utilization_gpu_ratio=device, processes=procs)
        shares = process_shares(g)
        assert set(shares) == {i for i, r in enumerate(raw) if r is not None}
        assert sum(shares.values()) <= (1.0 if device is None else device) + 1e-9
        known = {i: r for i, r in enumerate(raw) if r is not None}
        if sum(known.values()) <= (1.0 if device is None else device):
            assert shares == known  # nothing to scale
        for i, r in known.items():
            assert shares[i] <= r + 1e-12

    check()

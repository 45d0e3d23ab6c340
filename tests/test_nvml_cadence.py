"""Read cadence of the NVML layer (gpuwarden.nvml.device): what is read every poll, what once per GPM interval,
what at the slow cadence, and that readings carry the slower values in between.

Driven through the fake pynvml (tests/fake_nvml.py) fed by the real 2xH200 recording, with explicit poll times.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import trace
from fake_nvml import FakeNvml

from gpuwarden.nvml import NvmlSource
from gpuwarden.nvml.readings import SLOW_FIELDS

H200X2 = trace("h200x2-ddp_straggler")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    return FakeNvml(H200X2).install(monkeypatch)


def _poller(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, **kwargs: float):  # noqa: ANN202
    source = NvmlSource(xid_events=False, processes=False, **kwargs)  # type: ignore[arg-type]
    source.open()
    fields: list[list[int]] = []
    real = fake.nvmlDeviceGetFieldValues

    def spy(handle, ids):  # noqa: ANN001, ANN202
        fields.append(list(ids))
        return real(handle, ids)

    import pynvml

    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", spy)
    return source, source._pollers[0], fields


def test_fast_polls_read_gpm_once_a_second_and_the_sample_buffer_every_poll(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, gpu, fields = _poller(fake, monkeypatch, gpm_interval=1.0)
    t0 = 1_800_000_000.0
    # 3 s at a 0.1 s poll (30 polls: the 31st would replay the recording's first poll, which has no GPM)
    readings = [gpu.read(t0 + i * 0.1) for i in range(30)]
    # a GPM sample at 0, 1 and 2 s; metrics from the second sample on
    assert fake.calls["nvmlGpmSampleGet"] == 3
    assert fake.calls["nvmlGpmMetricsGet"] == 2
    assert readings[0].gpm == {} and readings[9].gpm == {}
    assert all(r.gpm for r in readings[10:]), "GPM values are carried between reads"
    assert readings[12].gpm == readings[11].gpm  # carried: no new GPM computation (the calls above)
    # the util.gpu sample buffer every poll (the instantaneous reading aliases periodic work), util.gpu every poll
    assert fake.calls["nvmlDeviceGetSamples"] == 30
    assert all(r.utilization_gpu_ratio is not None for r in readings)
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 30
    # the expensive field values once (slow cadence), the cheap ones every poll
    slow = [f for f in fields if set(f) & set(SLOW_FIELDS)]
    assert len(slow) == 1 and len(fields) == 31
    source.close()


def test_slow_fields_are_carried_between_slow_reads(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    source, gpu, fields = _poller(fake, monkeypatch, slow_interval=10.0)
    t0 = 1_800_000_000.0
    readings = [gpu.read(t0 + i) for i in range(21)]  # 20 s at a 1 s poll
    slow = [f for f in fields if set(f) & set(SLOW_FIELDS)]
    assert len(slow) == 3  # at 0, 10 and 20 s
    first = readings[0]
    if first.pcie_replay_total is None:
        pytest.skip("the recording has no PCIe replay counter")
    assert all(r.pcie_replay_total is not None for r in readings)
    keys = set(first.clock_event_seconds_total)
    assert {"hw_thermal_slowdown", "sw_power_cap"} <= keys
    assert all(set(r.clock_event_seconds_total) == keys for r in readings)
    source.close()


def test_one_second_polls_read_gpm_and_the_sample_buffer_every_poll(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, gpu, _ = _poller(fake, monkeypatch, gpm_interval=1.0)
    t0 = 1_800_000_000.0
    # a 1 s timer that wakes a few ms early still reads GPM every poll
    for i in range(6):
        gpu.read(t0 + i * 1.0 - (0.004 if i % 2 else 0.0))
    assert fake.calls["nvmlGpmSampleGet"] == 6
    assert fake.calls["nvmlGpmMetricsGet"] == 5
    assert fake.calls["nvmlDeviceGetSamples"] == 6
    source.close()


def test_gpm_is_computed_once_per_default_interval_at_one_second_polls(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, gpu, _ = _poller(fake, monkeypatch)
    t0 = 1_800_000_000.0
    readings = [gpu.read(t0 + i * 1.0) for i in range(21)]
    assert fake.calls["nvmlGpmSampleGet"] == 3  # at 0, 10 and 20 s (default gpm_interval 10 s)
    assert fake.calls["nvmlGpmMetricsGet"] == 2
    assert readings[10].gpm and all(r.gpm == readings[10].gpm for r in readings[10:20])
    source.close()


def test_slow_polls_read_the_sample_buffer_every_poll(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    source, gpu, _ = _poller(fake, monkeypatch)
    t0 = 1_800_000_000.0
    for i in range(4):
        gpu.read(t0 + i * 5.0)
    assert fake.calls["nvmlDeviceGetSamples"] == 4
    source.close()


def test_a_gpm_value_that_is_nan_or_infinite_is_absent_and_counted(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML computes GPM metrics as doubles: NaN or an infinity is left out of the reading (never exported, never
    averaged by the insight windows) and counted as an error of that metric."""
    import pynvml

    from gpuwarden.nvml.gpm import GPM_IDS

    source, gpu, _ = _poller(fake, monkeypatch, gpm_interval=1.0)
    real = fake.nvmlGpmMetricsGet
    ids = {GPM_IDS["sm_activity"][0]: float("nan"), GPM_IDS["pcie_rx_bytes_per_second"][0]: float("inf")}

    def poisoned(req):  # noqa: ANN001, ANN202
        real(req)
        for i in range(req.numMetrics):
            if req.metrics[i].metricId in ids:
                req.metrics[i].value = ids[req.metrics[i].metricId]
        return req

    monkeypatch.setattr(pynvml, "nvmlGpmMetricsGet", poisoned)
    t0 = 1_800_000_000.0
    readings = [gpu.read(t0 + i) for i in range(4)]
    gpm = readings[-1].gpm
    assert gpm and "sm_activity" not in gpm and "pcie_rx_bytes_per_second" not in gpm
    assert "sm_occupancy" in gpm  # the other metrics of the same computation are kept
    errors = source.errors()
    assert errors[("nvmlGpmMetricsGet(sm_activity)", "not_finite")] == 3
    assert errors[("nvmlGpmMetricsGet(pcie_rx_bytes_per_second)", "not_finite")] == 3
    source.close()


def test_the_pcie_link_width_is_read_at_the_slow_cadence_and_carried(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvmlDeviceGetCurrPcieLinkWidth costs ~26 µs against ~1 µs for the generation: read with the slow readings."""
    source, gpu, _ = _poller(fake, monkeypatch, slow_interval=10.0)
    t0 = 1_800_000_000.0
    readings = [gpu.read(t0 + i) for i in range(25)]  # 25 s at a 1 s poll: slow reads at 0, 10, 20 s
    assert fake.calls["nvmlDeviceGetCurrPcieLinkWidth"] == 3
    assert fake.calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 25
    assert all(r.pcie_width is not None and r.pcie_width == readings[0].pcie_width for r in readings)
    source.close()


def test_the_host_cpu_times_are_read_once_per_host_gap(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    """psutil.cpu_times (/proc/stat) at most every host_min_gap seconds; the polls in between carry no host."""
    import types

    import gpuwarden.nvml.source as source_module

    clock = [1_800_000_000.0]
    fake_time = types.SimpleNamespace(time=lambda: clock[0], perf_counter=time.perf_counter, monotonic=time.monotonic)
    monkeypatch.setattr(source_module, "time", fake_time)
    source = NvmlSource(xid_events=False, processes=False, host_min_gap=5.0)
    source.open()
    hosts = []
    for _ in range(12):  # 12 polls, 1 s apart: host read at 0, 5 and 10 s
        hosts.append(source.poll().host)
        clock[0] += 1.0
    assert [h is not None for h in hosts] == [i % 5 == 0 for i in range(12)]
    every = NvmlSource(xid_events=False, processes=False, host_min_gap=0.0)  # what `gpuwarden record` uses
    every.open()
    assert all(every.poll().host is not None for _ in range(3))
    every.close()
    source.close()


@pytest.mark.parametrize("legacy", [False, True])
def test_per_process_utilization_is_read_every_interval_and_carried(
    monkeypatch: pytest.MonkeyPatch, legacy: bool
) -> None:
    """Per-process utilization, one of the slowest reads, is read once per PROCESS_UTILIZATION_INTERVAL from
    nvmlDeviceGetProcessesUtilizationInfo, or, where the driver lacks it (FUNCTION_NOT_FOUND, asked once), from
    nvmlDeviceGetProcessUtilization; the recorded per-process values come through either and are carried in between
    (fake NVML fed by the real two-process H100 recording)."""
    from gpuwarden.nvml import device

    fake = FakeNvml(trace("h100-shared-slurm-env")).install(monkeypatch)
    fake.legacy_process_utilization = legacy
    clock = [1000.0]
    monkeypatch.setattr(device.time, "monotonic", lambda: clock[0])  # type: ignore[attr-defined]  # its clock
    source = NvmlSource(xid_events=False, processes=True)
    source.open()
    polls = []
    for step in (5.0, 1.0, 1.0, 0.0):  # reads at the first two polls (5 s apart), none at the next two
        polls.append(source.poll())
        clock[0] += step
    source.close()
    newer, older = fake.calls["nvmlDeviceGetProcessesUtilizationInfo"], fake.calls["nvmlDeviceGetProcessUtilization"]
    assert (newer, older) == ((1, 2) if legacy else (2, 0))
    assert all("process_sm_utilization" not in p.gpus[0].failing for p in polls)
    carried = [{pr.pid: pr.sm_utilization_ratio for pr in p.gpus[0].processes or ()} for p in polls[1:]]
    assert carried[0] == carried[1] == carried[2]
    assert len(carried[0]) == 2 and all(v is not None and 0 <= v <= 1 for v in carried[0].values())


def test_an_unsupported_call_is_asked_once_and_its_fallback_read_every_poll(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver without nvmlDeviceGetMemoryInfo v2 (NOT_SUPPORTED): v2 is asked at the first poll only, and memory
    comes from v1 at every poll (never lost, never retried)."""
    import pynvml

    real = fake.nvmlDeviceGetMemoryInfo
    versions: list[int | None] = []

    def no_v2(handle, version=None):  # noqa: ANN001, ANN202
        versions.append(version)
        if version == pynvml.nvmlMemory_v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return real(handle)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", no_v2)
    source, gpu, _ = _poller(fake, monkeypatch)
    t0 = 1_800_000_000.0
    readings = [gpu.read(t0 + i) for i in range(10)]
    assert all(r.memory_used_bytes is not None and r.memory_total_bytes for r in readings)
    assert versions.count(pynvml.nvmlMemory_v2) == 1, versions
    assert source.errors() == {}  # NOT_SUPPORTED is remembered, not counted as an error


def test_a_listed_pid_that_proc_lacks_takes_the_job_of_the_process_keeping_its_device_open(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """NVML goes on listing a process that exited while a child it forked keeps the device open. Here the recorded
    PIDs are absent from this machine's /proc; a child of this test holds the files standing for the GPU's device (its
    recorded minor number) and CUDA's: each absent PID gets it as keeper, with its user and cgroup, one /proc scan
    in all."""
    import subprocess
    import sys

    import psutil

    from gpuwarden import procinfo

    fake = FakeNvml(trace("h100-shared-slurm-env")).install(monkeypatch)
    minor = fake.header.node.gpus[0].minor_number
    assert minor is not None
    device, uvm = tmp_path / f"nvidia{minor}", tmp_path / "nvidia-uvm"
    device.write_text("")
    uvm.write_text("")
    monkeypatch.setattr(procinfo, "DEVICE_FILE", str(tmp_path / "nvidia{minor}"))
    monkeypatch.setattr(procinfo, "UVM_FILE", str(uvm))
    code = f"import time; a = open({str(device)!r}); b = open({str(uvm)!r}); print('ok', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ok\n"
        source = NvmlSource(xid_events=False, processes=True)
        source.open()
        polls = [source.poll() for _ in range(3)]
        scans = source._inspector.keeper_scans if source._inspector else None  # noqa: SLF001
        source.close()
    finally:
        child.kill()
        child.wait()
    absent = [p for p in polls[-1].gpus[0].processes or [] if not psutil.pid_exists(p.pid)]
    if not absent:
        pytest.skip("the recorded PIDs all run on this machine")  # recorded on another host: never so far
    assert all(p.kept_by == child.pid and p.create_time is None for p in absent)
    assert {p.cgroup for p in absent} == {procinfo.read_cgroup(os.getpid())} and scans == 1


def _steady_memory(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, used: list[int]) -> None:
    """Make every GPU answer ``used[0]`` bytes in use (nvmlDeviceGetMemoryInfo), whatever the recording says."""
    import pynvml

    real = fake.nvmlDeviceGetMemoryInfo

    def memory(handle, version=None):  # noqa: ANN001, ANN202
        mem = real(handle, version)
        mem.used = used[0]
        return mem

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", memory)


def test_the_process_list_is_read_every_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvmlDeviceGetComputeRunningProcesses is asked at every poll, with the GPU's memory steady (a process replaced
    by another of the same memory is seen at once), and each process described anew from /proc (fake NVML fed by the
    real two-process H100 recording)."""
    fake = FakeNvml(trace("h100-shared-slurm-env")).install(monkeypatch)
    _steady_memory(fake, monkeypatch, [40 * 2**30])
    source = NvmlSource(xid_events=False, processes=True)
    source.open()
    polls = [source.poll() for _ in range(5)]
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 5
    pids = [sorted(p.pid for p in poll.gpus[0].processes or ()) for poll in polls]
    assert len(pids[0]) == 2 and all(p == pids[0] for p in pids)
    source.close()


def test_a_process_that_starts_is_listed_at_the_next_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that comes is listed at the first poll after it came, and gone at the first poll after it went,
    though the GPU's memory in use does not move (a process replaced by another of the same size)."""
    import os

    fake = FakeNvml(trace("h100-shared-slurm-env")).install(monkeypatch)
    used = [fake.devices[0].records[0].memory_used_bytes or 0]
    _steady_memory(fake, monkeypatch, used)
    source = NvmlSource(xid_events=False, processes=True)
    source.open()
    source.poll()
    fake.hold(0, [os.getpid()])
    assert [p.pid for p in source.poll().gpus[0].processes or ()] == [os.getpid()]
    fake.hold(0, [])
    assert source.poll().gpus[0].processes == []
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 3
    source.close()


def test_a_failed_process_list_is_none_and_the_next_poll_asks_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed call gives no list (None, never an empty one: unknown is not none) and counts its error; the next
    poll has the list again."""
    import pynvml

    fake = FakeNvml(trace("h100-shared-slurm-env")).install(monkeypatch)
    real = fake.nvmlDeviceGetComputeRunningProcesses
    failing = [True]

    def flaky(handle):  # noqa: ANN001, ANN202
        if failing[0]:
            failing[0] = False
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return real(handle)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", flaky)
    source = NvmlSource(xid_events=False, processes=True)
    source.open()
    assert source.poll().gpus[0].processes is None
    assert len(source.poll().gpus[0].processes or ()) == 2
    assert source.errors()[("nvmlDeviceGetComputeRunningProcesses", "unknown")] == 1
    source.close()


def test_every_process_reading_zero_beside_a_busy_gpu_is_not_believed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The legacy per-process call reads 0 for every process on Blackwell while the GPU works: those zeros are not
    exported as readings (sm_utilization_ratio None) and the reading is failing with why, until the processes read
    work again."""
    import pynvml

    fake = FakeNvml(trace("h100-shared-slurm-env")).install(monkeypatch)
    real = fake.nvmlDeviceGetProcessesUtilizationInfo
    zero = [True]

    def zeros(handle, last):  # noqa: ANN001, ANN202
        out = real(handle, last)
        for s in out if zero[0] else ():
            s.smUtil = 0
        return out

    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessesUtilizationInfo", zeros)
    from gpuwarden.nvml import device

    clock = [1000.0]
    monkeypatch.setattr(device.time, "monotonic", lambda: clock[0])  # type: ignore[attr-defined]  # its clock
    source = NvmlSource(xid_events=False, processes=True)
    source.open()
    source.poll()  # the recording's first poll has no per-process sample
    clock[0] += device.PROCESS_UTILIZATION_INTERVAL
    first = source.poll().gpus[0]
    assert (first.utilization_gpu_ratio or 0.0) >= device.PROCESS_ZERO_BUSY_MIN  # the recording's GPU works
    assert first.failing.get("process_sm_utilization") == "zero_beside_busy_gpu"
    assert first.processes and all(p.sm_utilization_ratio is None for p in first.processes)
    zero[0] = False
    clock[0] += device.PROCESS_UTILIZATION_INTERVAL
    second = source.poll().gpus[0]
    assert "process_sm_utilization" not in second.failing
    assert second.processes and any(p.sm_utilization_ratio for p in second.processes)
    source.close()

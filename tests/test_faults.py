"""Faults, injected in the NVML layer through the fake NVML (tests/fake_nvml.py) fed by real traces.

A GPU lost mid-run, an NVML call that hangs, NVML or the driver missing at start, a driver reload, XID
events, SIGHUP and SIGTERM. The real NVML layer (gpuwarden/nvml) runs unchanged above the fake.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pynvml
import pytest
from conftest import render, replay_poller, trace
from fake_nvml import FakeNvml
from fastapi.testclient import TestClient
from helpers import free_port, skip_where_nvml_works
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.catalog import select_collectors
from gpuwarden.collectors import CollectOptions
from gpuwarden.config import Config, load_config
from gpuwarden.daemon import Daemon, bind, build_analyzers
from gpuwarden.exposition import Exposition
from gpuwarden.nvml import NvmlSource
from gpuwarden.nvml import source as nvml_source
from gpuwarden.poller import Poller
from gpuwarden.sdnotify import Notifier
from gpuwarden.source import SourceError
from gpuwarden.web.app import create_app

REPO = Path(__file__).parent.parent
H200X2 = trace("h200x2-ddp_straggler")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples
    }


def value(text: str, name: str, **labels: str) -> float | None:
    """The sample of ``name`` with exactly ``labels`` (gpu_devices: whatever its nodename)."""
    found = samples(text)
    if name == "gpu_devices" and not labels:
        return next((v for (n, _), v in found.items() if n == name), None)
    return found.get((name, frozenset(labels.items())))


def gpus_with(text: str, name: str) -> set[str]:
    return {dict(k[1])["gpu"] for k in samples(text) if k[0] == name}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    # Re-initialisation backoff in tens of milliseconds instead of seconds.
    monkeypatch.setattr(nvml_source, "RETRY_FIRST_SECONDS", 0.05)
    monkeypatch.setattr(nvml_source, "RETRY_MAX_SECONDS", 0.1)
    return FakeNvml(H200X2).install(monkeypatch)


def nvml_poller(**kwargs: object) -> Poller:
    # polls in these tests are milliseconds apart: read GPM at every poll
    kwargs = {"gpm_interval": 0.0, **kwargs}
    return Poller(NvmlSource(**kwargs), 1.0)  # type: ignore[arg-type]


def test_fake_nvml_daemon_scrape_equals_the_replay_of_the_same_trace(fake: FakeNvml) -> None:
    live = nvml_poller()
    live.start(thread=False)
    for _ in range(4):
        live.poll_once()
    replay = replay_poller(H200X2, 5)
    a, b = samples(render(live.snapshot)), samples(render(replay.snapshot))
    # the trace was recorded before gpuwarden kept which readings a GPU never answers; the fake NVML answers
    # NOT_SUPPORTED for each reading the recording lacks, and the live daemon says so, reading by reading
    unsupported = {dict(k[1])["reading"] for k in a if k[0] == "gpu_reading_unsupported"}
    assert "temperature_memory_celsius" not in unsupported and unsupported, unsupported
    for g in live.snapshot.poll.gpus:
        for name in g.unsupported:
            field, _, key = name.partition(":")
            assert getattr(g, field) in (None, {}) or key not in getattr(g, field), name
    a = {k: v for k, v in a.items() if k[0] != "gpu_reading_unsupported"}
    # the recorded PIDs do not run here: /proc gives the live daemon no start time, the trace has the recorded one
    assert {k[0] for k in a} == {k[0] for k in b} - {"gpu_process_start_time_seconds"}
    # process names come from /proc, where the recorded PIDs do not run; gpuwarden_* describe the daemon
    skip = ("gpu_process_", "gpuwarden_")
    gpu_a = {k: v for k, v in a.items() if not k[0].startswith(skip)}
    gpu_b = {k: v for k, v in b.items() if not k[0].startswith(skip)}
    assert gpu_a == gpu_b
    for name in ("gpu_utilization_ratio", "gpu_sm_activity_ratio", "gpu_memory_used_bytes", "gpu_power_usage_watts"):
        assert gpus_with(render(live.snapshot), name) == {"0", "1"}, name
    assert live.snapshot.errors == {}
    live.stop()
    assert fake.calls["nvmlInit"] == 1 and fake.calls["nvmlShutdown"] == 1
    assert fake.calls["nvmlGpmSampleFree"] == 4  # two samples per GPU


def test_a_gpu_lost_mid_run_goes_down_alone(fake: FakeNvml) -> None:
    fake.lose(1, from_poll=3)
    p = nvml_poller()
    p.start(thread=False)
    text = render(p.snapshot)
    assert value(text, "gpu_up", gpu="1", uuid=fake.devices[1].static.uuid) == 1.0
    for _ in range(4):
        p.poll_once()
    text = render(p.snapshot)
    uuids = [d.static.uuid for d in fake.devices]
    assert value(text, "gpu_up", gpu="0", uuid=uuids[0]) == 1.0
    assert value(text, "gpu_up", gpu="1", uuid=uuids[1]) == 0.0
    assert gpus_with(text, "gpu_utilization_ratio") == {"0"}  # the lost GPU's readings are gone, not stale
    assert gpus_with(text, "gpu_power_usage_watts") == {"0"}
    assert value(text, "gpuwarden_source_up") == 1.0
    errors = samples(text).items()
    lost = sum(v for k, v in errors if k[0] == "gpuwarden_nvml_errors_total" and ("error", "gpu_is_lost") in k[1])
    assert lost == 3  # polls 3, 4 and 5
    assert p.snapshot.poll.gpus[1].error == "gpu_is_lost"
    assert fake.calls["nvmlInit"] == 1  # one GPU lost is not a reason to re-initialise
    p.stop()


def test_a_lost_gpus_job_keeps_holding_it_while_its_process_runs(fake: FakeNvml) -> None:
    """NVML lists no process on a lost GPU: the daemon keeps the processes that held it at its last good read while
    they still run (same PID and start time in /proc), so the job's info series go on and its time on the lost GPU
    is the job's lost time; they end when the process does. GPU 1 is held by a real child process."""
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as child:
        try:
            fake.hold(1, [child.pid])
            p = Poller(NvmlSource(gpm_interval=0.0), 1.0, analyzers=build_analyzers(Config()))
            p.start(thread=False)
            p.poll_once()
            uuid = fake.devices[1].static.uuid
            assert {s.labels["pid"] for s in _job_info(p, "1")} == {str(child.pid)}
            fake.lose(1)
            p.poll_once()
            p.poll_once()
            text = render(p.snapshot)
            assert value(text, "gpu_up", gpu="1", uuid=uuid) == 0.0
            [held] = _job_info(p, "1")  # still the child's job, on the lost GPU
            assert held.labels["pid"] == str(child.pid) and held.labels["job_kind"] == "process"
            assert gpus_with(text, "gpu_process_memory_used_bytes") == {"0"}  # nothing NVML did not say
        finally:
            child.kill()
            child.wait()
        p.poll_once()
        assert _job_info(p, "1") == []  # the process ended: the lost GPU is no one's
        assert p.snapshot.poll.gpus[1].processes == []
        p.stop()


def _job_info(p: Poller, gpu: str) -> list:
    """The gpu_process_job_info samples of GPU ``gpu`` in the poller's latest snapshot."""
    return [
        s
        for f in text_string_to_metric_families(render(p.snapshot))
        for s in f.samples
        if s.name == "gpu_process_job_info" and s.labels["gpu"] == gpu
    ]


def _poll_until(p: Poller, cond: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.03)
        p.poll_once()


@pytest.mark.parametrize(
    "fault",
    ["uninitialized", "lib_rm_version_mismatch", "unknown", "all_gpus_lost"],
)
def test_driver_reload_reinitialises_nvml(fake: FakeNvml, fault: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpuwarden")
    p = nvml_poller()
    p.start(thread=False)
    p.poll_once()
    uuids = [d.static.uuid for d in fake.devices]
    if fault == "all_gpus_lost":
        fake.lose(0)
        fake.lose(1)
    else:
        fake.unload(getattr(pynvml, f"NVML_ERROR_{fault.upper()}"))
    p.poll_once()
    text = render(p.snapshot)
    assert [value(text, "gpu_up", gpu=str(i), uuid=uuids[i]) for i in (0, 1)] == [0.0, 0.0]
    assert value(text, "gpuwarden_source_up") == 0.0
    assert not gpus_with(text, "gpu_utilization_ratio")
    assert fake.calls["nvmlShutdown"] == 1  # closed, to be re-opened
    # NVML stays unavailable for a while: retries back off, each failure counted, one log line in all
    for _ in range(6):
        time.sleep(0.03)
        p.poll_once()
    assert p.snapshot.source_up is False
    assert fake.calls["nvmlInit"] >= 3
    errors = p.snapshot.errors
    if fault == "all_gpus_lost":
        assert errors[("nvmlDeviceGetUtilizationRates", "gpu_is_lost")] >= 2
    else:
        assert errors[("nvmlInit", "driver_not_loaded")] >= 2
        assert sum(n for (call, err), n in errors.items() if err == fault) >= 2
    down_lines = [r for r in caplog.records if "re-initialising NVML" in r.getMessage()]
    reason = "gpu_is_lost" if fault == "all_gpus_lost" else fault
    assert len(down_lines) == 1 and f"({reason})" in down_lines[0].getMessage()
    # the driver is back: NVML is re-initialised, GPUs rediscovered (new handles), readings return
    if fault == "all_gpus_lost":
        fake.restore(0)
        fake.restore(1)
    else:
        fake.load()
    _poll_until(p, lambda: p.snapshot.source_up)
    p.poll_once()
    text = render(p.snapshot)
    assert [value(text, "gpu_up", gpu=str(i), uuid=uuids[i]) for i in (0, 1)] == [1.0, 1.0]
    assert gpus_with(text, "gpu_utilization_ratio") == {"0", "1"}
    assert gpus_with(text, "gpu_sm_activity_ratio") == {"0", "1"}  # GPM samples were re-allocated
    assert value(text, "gpuwarden_source_up") == 1.0
    assert len([r for r in caplog.records if "NVML initialised again" in r.getMessage()]) == 1
    p.stop()
    assert not fake.initialized and fake.calls["nvmlShutdown"] >= 2  # every successful nvmlInit was shut down


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.01)
    yield sock, path
    sock.close()


def received(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except (TimeoutError, BlockingIOError):
            return out


def app_for(p: Poller, stale_after: float) -> TestClient:
    exp = Exposition(p, select_collectors(), CollectOptions())
    return TestClient(create_app(p, exp, stale_after))


def test_a_hanging_nvml_call_marks_data_stale_and_scrapes_still_answer(
    fake: FakeNvml, notify_socket: tuple[socket.socket, str], caplog: pytest.LogCaptureFixture
) -> None:
    sock, path = notify_socket
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"})
    p = Poller(NvmlSource(), 0.1, deadline=0.6, notifier=notifier)
    client = app_for(p, stale_after=0.6)
    p.start()
    try:
        time.sleep(0.5)
        assert client.get("/readyz").status_code == 200
        before = received(sock)
        assert before[0].startswith("READY=1") and "WATCHDOG=1" in before[1:]
        fake.hang("nvmlDeviceGetPowerUsage")
        assert fake.entered("nvmlDeviceGetPowerUsage").wait(5)
        hung_at = time.monotonic()
        # scrapes answer at once while the poll hangs
        for _ in range(5):
            t = time.perf_counter()
            assert client.get("/metrics").status_code == 200
            assert time.perf_counter() - t < 0.5
        # the watchdog withdraws the stale readings, readiness fails, systemd is no longer fed
        deadline = time.monotonic() + 5
        while value(client.get("/metrics").text, "gpuwarden_source_up") != 0.0:
            assert time.monotonic() < deadline, "the watchdog never marked the data stale"
            time.sleep(0.05)
        assert time.monotonic() - hung_at < 2.5
        text = client.get("/metrics").text
        assert not gpus_with(text, "gpu_utilization_ratio") and value(text, "gpu_devices") == 2.0
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "old" in ready.json()["reason"]
        assert "an NVML call does not return" in ready.json()["reason"]
        assert any("poll has been running for" in r.getMessage() for r in caplog.records)
        received(sock)
        time.sleep(0.5)
        assert "WATCHDOG=1" not in received(sock)
        # the call returns: polling, readings, readiness and the systemd watchdog come back
        fake.release("nvmlDeviceGetPowerUsage")
        deadline = time.monotonic() + 5
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "did not recover after the hang"
            time.sleep(0.05)
        text = client.get("/metrics").text
        assert gpus_with(text, "gpu_utilization_ratio") == {"0", "1"} and value(text, "gpuwarden_source_up") == 1.0
        time.sleep(0.5)
        assert "WATCHDOG=1" in received(sock)
    finally:
        fake.release("nvmlDeviceGetPowerUsage")
        p.stop()
    assert received(sock)[-1] == "STOPPING=1"
    assert fake.calls["nvmlShutdown"] == 1


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVML unavailable: the NVIDIA kernel driver is not loaded"),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML unavailable: the NVML library (libnvidia-ml.so.1) was not found"),
    ],
)
def test_nvml_missing_at_start_is_one_line(fake: FakeNvml, code: int, message: str) -> None:
    fake.init_error = code
    with pytest.raises(SourceError) as exc:
        NvmlSource().open()
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


def test_wait_for_nvml_serves_source_down_then_reports_when_nvml_appears(fake: FakeNvml) -> None:
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    p = nvml_poller(wait=True)
    client = app_for(p, stale_after=5)
    p.start(thread=False)
    for _ in range(3):
        time.sleep(0.03)
        p.poll_once()
    text = client.get("/metrics").text
    assert value(text, "gpuwarden_source_up") == 0.0 and value(text, "gpu_devices") == 0.0
    assert not [k for k in samples(text) if k[0] == "gpu_up"]
    assert value(text, "gpuwarden_nvml_errors_total", call="nvmlInit", error="driver_not_loaded") >= 2
    ready = client.get("/readyz")
    because = "NVML unavailable: the NVIDIA kernel driver is not loaded"
    assert ready.status_code == 503 and ready.json()["reason"].startswith(f"no successful poll yet: {because}")
    assert client.get("/api/v1/gpus").json()["gpus"] == []
    assert client.get("/api/v1/gpus").json()["down_reason"].startswith(because)
    fake.init_error = None  # the driver is loaded
    _poll_until(p, lambda: p.snapshot.source_up)
    p.poll_once()
    text = client.get("/metrics").text
    assert value(text, "gpu_devices") == 2.0 and value(text, "gpuwarden_source_up") == 1.0
    assert gpus_with(text, "gpu_up") == {"0", "1"} and gpus_with(text, "gpu_sm_activity_ratio") == {"0", "1"}
    assert client.get("/readyz").status_code == 200
    assert [g["static"]["name"] for g in client.get("/api/v1/gpus").json()["gpus"]] == ["NVIDIA H200"] * 2
    assert client.get("/api/v1/gpus").json()["down_reason"] is None
    p.stop()


def test_xid_events_are_counted_per_gpu(fake: FakeNvml) -> None:
    p = nvml_poller()
    p.start(thread=False)
    fake.inject_xid(1, 79)
    _poll_until(p, lambda: 1 in p.snapshot.xid)
    text = render(p.snapshot)
    assert value(text, "gpu_xid_errors_total", gpu="1", uuid=fake.devices[1].static.uuid, xid="79") == 1.0
    assert 0 not in p.snapshot.xid
    p.stop()
    assert fake.calls["nvmlEventSetFree"] == 1


@pytest.mark.e2e
def test_sigterm_in_process_stops_cleanly_with_nvml_shutdown(fake: FakeNvml) -> None:
    cfg = load_config(overrides={"listen_address": "127.0.0.1:0", "poll_interval_seconds": 0.2})
    daemon = Daemon(cfg)
    sock = bind(cfg)
    port = sock.getsockname()[1]
    daemon.start()
    seen: dict[str, object] = {}

    def client() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                seen["metrics"] = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                break
            except httpx.TransportError:
                time.sleep(0.1)
        seen["shutdowns_before"] = fake.calls["nvmlShutdown"]
        seen["sent"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=client)
    t.start()
    daemon.serve(sock)  # returns on SIGTERM (the server's handler, installed in the main thread)
    t.join()
    assert time.monotonic() - seen["sent"] < 5  # type: ignore[operator]
    assert gpus_with(seen["metrics"], "gpu_up") == {"0", "1"}  # type: ignore[arg-type]
    assert seen["shutdowns_before"] == 0 and fake.calls["nvmlShutdown"] == 1


def test_notifier_is_a_no_op_without_systemd_and_speaks_abstract_sockets() -> None:
    off = Notifier({})
    assert not off.enabled and off.ready() is False and off.watchdog() is False
    name = f"gpuwarden-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        s.settimeout(2)
        n = Notifier({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())})
        assert n.watchdog_seconds == 2.0
        assert n.ready("serving") and s.recv(100) == b"READY=1\nSTATUS=serving"
        assert n.watchdog() and s.recv(100) == b"WATCHDOG=1"
        n.close()
    other = Notifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_seconds is None  # the watchdog is meant for another process


# -- the daemon as a process: SIGHUP reload, SIGTERM exit, --nvml.wait ---------------------------------


def start_serve(*args: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "serve", "--web.listen-address", f"127.0.0.1:{port}", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"daemon did not come up: {proc.communicate()[1]}")
        time.sleep(0.1)


def families(base: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(httpx.get(f"{base}/metrics").text)}


def wait_for(cond: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


def terminate(proc: subprocess.Popen[str]) -> tuple[int, float, str]:
    t = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, time.monotonic() - t, err


@pytest.mark.e2e
def test_sighup_reloads_the_config_and_sigterm_exits_0(tmp_path: Path) -> None:
    cfg = tmp_path / "gpuwarden.yml"
    cfg.write_text("poll_interval_seconds: 0.2\n")
    proc, base = start_serve("--replay", str(trace("h100-idle")), "--config.file", str(cfg))
    try:
        assert "gpu_power_usage_watts" in families(base)
        cfg.write_text("poll_interval_seconds: 0.2\ncollectors:\n  disable: [power]\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "gpu_power_usage_watts" not in families(base))
        assert "gpu_utilization_ratio" in families(base)
        # a bad file on SIGHUP: logged, the running configuration kept, still serving
        cfg.write_text("poll_interval_seconds: 0\n")
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None
        names = families(base)
        assert "gpu_utilization_ratio" in names and "gpu_power_usage_watts" not in names
        assert httpx.get(f"{base}/readyz").status_code == 200
    finally:
        code, took, err = terminate(proc)
    assert code == 0 and took < 5, err
    assert "reload refused, keeping the running configuration" in err and "poll_interval_seconds" in err
    assert "Traceback" not in err


@pytest.mark.e2e
def test_wait_for_nvml_process_serves_source_down_without_a_driver() -> None:
    skip_where_nvml_works("the no-driver path")
    proc, base = start_serve("--nvml.wait", "--poll.interval", "0.2")
    try:
        text = httpx.get(f"{base}/metrics").text
        assert value(text, "gpuwarden_source_up") == 0.0 and value(text, "gpu_devices") == 0.0
        assert httpx.get(f"{base}/readyz").status_code == 503
        wait_for(
            lambda: (
                (
                    value(
                        httpx.get(f"{base}/metrics").text,
                        "gpuwarden_nvml_errors_total",
                        call="nvmlInit",
                        error="library_not_found",
                    )
                    or 0
                )
                >= 2
            )
        )
        assert proc.poll() is None
    finally:
        code, took, err = terminate(proc)
    assert code == 0 and took < 5, err
    warnings = [line for line in err.splitlines() if "NVML unavailable" in line]
    assert len(warnings) == 1 and "retrying" in warnings[0]  # one line, not one per retry


def test_a_reading_that_fails_is_said_per_gpu_until_it_reads_again(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that times out on one GPU (not unsupported: asked again every poll) is named on that GPU's
    ``gpu_reading_failing{reading, error}`` while it fails, with a field of the batch that came back with an error;
    once it reads again the series goes. The other GPU says nothing."""
    power = pynvml.nvmlDeviceGetPowerUsage
    fields = pynvml.nvmlDeviceGetFieldValues
    failing = {"on": True}
    second = fake.devices[1].static.uuid

    def on_gpu1(handle: object) -> bool:
        return failing["on"] and fake.nvmlDeviceGetUUID(handle) == second

    def power_usage(handle: object) -> object:
        if on_gpu1(handle):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return power(handle)

    def field_values(handle: object, ids: list) -> object:
        values = fields(handle, ids)
        for fv in values:
            if on_gpu1(handle) and fv.fieldId == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                fv.nvmlReturn = pynvml.NVML_ERROR_UNKNOWN
        return values

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", power_usage)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", field_values)
    live = nvml_poller()
    live.start(thread=False)
    live.poll_once()
    text = render(live.snapshot)
    got = {(dict(k[1])["gpu"], dict(k[1])["reading"], dict(k[1])["error"]) for k in samples(text)
           if k[0] == "gpu_reading_failing"}  # fmt: skip
    assert got == {("1", "power_usage_watts", "timeout"), ("1", "temperature_memory_celsius", "unknown")}
    assert "power_usage_watts" not in live.snapshot.poll.gpus[1].unsupported  # asked again, not given up
    failing["on"] = False
    live.poll_once()
    assert not [k for k in samples(render(live.snapshot)) if k[0] == "gpu_reading_failing"]

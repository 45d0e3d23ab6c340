"""What the benchmarks share: starting an exporter process, scraping it, sampling its CPU and memory, and
reading its exposition.

The scraper is a bounded client loop: one scrape every ``scrape_interval`` seconds over one keep-alive HTTP/1.1
connection (re-opened when the server closes it), for ``duration`` seconds, on loopback only. Latency is from
sending the request to the last byte of the body. CPU is the process's user + system time (plus that of children
it waited for, so an exporter that shells out pays for its ``nvidia-smi``) over the measured window, as % of one
core; resident memory is sampled every 0.25 s (peak and last).
"""

from __future__ import annotations

import http.client
import os
import platform
import signal
import socket
import statistics
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families

MIB = 1048576.0
#: Label names that carry the GPU index in the exporters measured (gpuwarden: gpu; nvitop-exporter: index).
GPU_LABEL_KEYS = ("gpu", "index")


def free_port() -> int:
    """Return a TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def quantile(values: list[float], q: float) -> float | None:
    """Return the ``q`` quantile (0-1) of ``values`` by nearest rank; None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


@dataclass
class ExpositionStats:
    """What one exposition holds: size, families, series, series per GPU, and gpuwarden's poll figures."""

    bytes: int = 0
    families: int = 0
    series: int = 0
    gpus: int = 0
    series_per_gpu_mean: float | None = None
    series_per_gpu_max: int | None = None
    node_series: int = 0
    poll_duration_seconds: float | None = None
    polls_total: float | None = None


def parse_exposition(body: bytes) -> ExpositionStats:
    """Count families, series, and series per GPU (samples labelled with a GPU index), with prometheus_client's
    parser of the text format."""
    st = ExpositionStats(bytes=len(body))
    per_gpu: dict[str, int] = {}
    for family in text_string_to_metric_families(body.decode("utf-8", "replace")):
        st.families += 1
        for sample in family.samples:
            st.series += 1
            gpu = next((sample.labels[k] for k in GPU_LABEL_KEYS if k in sample.labels), None)
            if gpu is None:
                st.node_series += 1
            else:
                per_gpu[gpu] = per_gpu.get(gpu, 0) + 1
            if sample.name == "gpuwarden_poll_duration_seconds":
                st.poll_duration_seconds = float(sample.value)
            elif sample.name == "gpuwarden_polls_total":
                st.polls_total = float(sample.value)
    st.gpus = len(per_gpu)
    if per_gpu:
        st.series_per_gpu_mean = sum(per_gpu.values()) / len(per_gpu)
        st.series_per_gpu_max = max(per_gpu.values())
    return st


class Scraper:
    """GETs one path of one loopback server over a keep-alive connection, timing each answer."""

    def __init__(self, host: str, port: int, path: str = "/metrics", timeout: float = 10.0, tls: bool = False) -> None:
        self.host, self.port, self.path, self.timeout, self.tls = host, port, path, timeout, tls
        self._conn: http.client.HTTPConnection | None = None

    def get(self) -> tuple[float, int, bytes]:
        """Return (seconds, status, body) of one GET; reconnects once when the kept-alive connection is gone."""
        for attempt in (0, 1):
            if self._conn is None and self.tls:  # a throw-away certificate: not verified
                import ssl

                unverified = ssl._create_unverified_context()  # noqa: S323
                self._conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=unverified)
                self._conn.connect()
                self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            elif self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
                self._conn.connect()
                self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                t0 = time.perf_counter()
                self._conn.request("GET", self.path, headers={"Accept": "text/plain"})
                resp = self._conn.getresponse()
                body = resp.read()
                elapsed = time.perf_counter() - t0
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt:
                    raise
                continue
            if resp.will_close:
                self.close()
            return elapsed, resp.status, body
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def wait_until_serving(scraper: Scraper, timeout: float) -> None:
    """Return once ``scraper``'s daemon answers 200; raises OSError when it does not within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if scraper.get()[1] == 200:
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class ResourceSampler:
    """Samples a process's resident memory every ``period`` seconds in a thread; CPU from cpu_times deltas."""

    def __init__(self, pid: int, period: float = 0.25) -> None:
        self.proc = psutil.Process(pid)
        self.period = period
        self.rss: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)
        self._cpu0 = 0.0
        self._t0 = 0.0

    def cpu_seconds(self) -> float:
        """User + system seconds of the process and of the children it has waited for."""
        t = self.proc.cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def start(self) -> None:
        """Start the window: remember CPU time and wall time, start sampling memory."""
        self._cpu0 = self.cpu_seconds()
        self._t0 = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.rss.append(self.proc.memory_info().rss)
            except psutil.Error:
                return

    def stop(self) -> tuple[float, float]:
        """End the window; return (CPU % of one core over it, seconds it lasted)."""
        cpu = self.cpu_seconds() - self._cpu0
        wall = time.monotonic() - self._t0
        self._stop.set()
        self._thread.join()
        try:
            self.rss.append(self.proc.memory_info().rss)
        except psutil.Error:
            pass
        return 100.0 * cpu / wall if wall > 0 else 0.0, wall


@dataclass
class Measurement:
    """One exporter measured over one window: scrape latency, CPU, memory, exposition."""

    label: str
    scrapes: int = 0
    errors: int = 0
    duration_seconds: float = 0.0
    scrape_interval_seconds: float = 0.0
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    latency_max_ms: float | None = None
    fresh_scrapes: int = 0
    fresh_latency_p50_ms: float | None = None
    fresh_latency_p99_ms: float | None = None
    cpu_percent_of_core: float = 0.0
    rss_peak_mib: float | None = None
    rss_last_mib: float | None = None
    exposition: ExpositionStats = field(default_factory=ExpositionStats)
    poll_duration_p50_ms: float | None = None
    poll_duration_p99_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Return the measurement as plain JSON-able data."""
        return asdict(self)


def measure(
    label: str,
    pid: int,
    port: int,
    duration: float,
    scrape_interval: float,
    warmup: float = 3.0,
    host: str = "127.0.0.1",
    tls: bool = False,
) -> Measurement:
    """Scrape ``host:port/metrics`` every ``scrape_interval`` s for ``duration`` s after ``warmup`` s; measure ``pid``.

    A scrape is *fresh* when gpuwarden's ``gpuwarden_polls_total`` moved since the previous scrape (it paid for a
    render); exporters without that counter count every scrape as fresh.
    """
    scraper = Scraper(host, port, tls=tls)
    deadline = time.monotonic() + warmup
    while time.monotonic() < deadline:  # warm up: the first renders, imports, caches
        try:
            scraper.get()
        except OSError:
            pass
        time.sleep(scrape_interval)
    sampler = ResourceSampler(pid)
    sampler.start()
    lat: list[float] = []
    fresh: list[float] = []
    polls: list[float] = []
    errors = 0
    last_body = b""
    last_polls: float | None = None
    start = time.monotonic()
    next_at = start
    while True:
        now = time.monotonic()
        if now - start >= duration:
            break
        if next_at > now:
            time.sleep(next_at - now)
        next_at += scrape_interval
        try:
            elapsed, status, body = scraper.get()
        except OSError:
            errors += 1
            continue
        if status != 200 or not body:
            errors += 1
            continue
        lat.append(elapsed)
        last_body = body
        st = parse_exposition(body) if b"gpuwarden_polls_total" in body else None
        if st is not None and st.poll_duration_seconds is not None:
            polls.append(st.poll_duration_seconds)
        if st is None or st.polls_total is None or st.polls_total != last_polls:
            fresh.append(elapsed)
        if st is not None:
            last_polls = st.polls_total
    cpu, wall = sampler.stop()
    scraper.close()
    m = Measurement(label=label, scrapes=len(lat), errors=errors, duration_seconds=wall)
    m.scrape_interval_seconds = scrape_interval
    ms = [x * 1e3 for x in lat]
    m.latency_p50_ms, m.latency_p99_ms = quantile(ms, 0.5), quantile(ms, 0.99)
    m.latency_max_ms = max(ms) if ms else None
    fms = [x * 1e3 for x in fresh]
    m.fresh_scrapes = len(fms)
    m.fresh_latency_p50_ms, m.fresh_latency_p99_ms = quantile(fms, 0.5), quantile(fms, 0.99)
    m.cpu_percent_of_core = cpu
    if sampler.rss:
        m.rss_peak_mib = max(sampler.rss) / MIB
        m.rss_last_mib = sampler.rss[-1] / MIB
    m.exposition = parse_exposition(last_body)
    pms = [x * 1e3 for x in polls]
    m.poll_duration_p50_ms, m.poll_duration_p99_ms = quantile(pms, 0.5), quantile(pms, 0.99)
    return m


def start_exporter(
    cmd: list[str], port: int, log: Path, timeout: float = 60.0, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` (output to ``log``); wait until ``127.0.0.1:port/metrics`` answers 200 with a body.

    Raises RuntimeError (with the log's tail) when the process exits or does not answer within ``timeout`` s.
    """
    out = open(log, "wb")  # noqa: SIM115 - closed when the process is stopped
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    proc._bench_log = out  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            _, status, body = Scraper("127.0.0.1", port, timeout=2.0).get()
            if status == 200 and body:
                return proc
        except OSError:
            pass
        time.sleep(0.2)
    stop_exporter(proc)
    tail = log.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"{' '.join(cmd)} did not start (exit {proc.returncode}):\n{tail}")


def stop_exporter(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process (SIGKILL after 10 s) and close its log."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    log = getattr(proc, "_bench_log", None)
    if log is not None:
        log.close()


def machine() -> dict[str, Any]:
    """Describe the machine: CPU model, cores, memory, OS, Python."""
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_model": model,
        "cpu_cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def versions(*packages: str) -> dict[str, str | None]:
    """Return the installed version of each package (None when absent)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    # gpuwarden from a checkout is not installed: its version is the package's
    if "gpuwarden" in packages:
        from gpuwarden import __version__

        out["gpuwarden"] = __version__
    for p in packages:
        if p in out:
            continue
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = None
    return out


def gpu_facts() -> dict[str, Any] | None:
    """Return GPU model(s), driver, NVML and CUDA versions through pynvml; None without a usable NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no GPU here: nothing to describe
        return None
    try:

        def s(v: Any) -> str:
            return v.decode() if isinstance(v, bytes) else str(v)

        n = pynvml.nvmlDeviceGetCount()
        names = [s(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(n)]
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        return {
            "gpus": names,
            "driver_version": s(pynvml.nvmlSystemGetDriverVersion()),
            "nvml_version": s(pynvml.nvmlSystemGetNVMLVersion()),
            "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
        }
    finally:
        pynvml.nvmlShutdown()


def fmt(v: float | None, digits: int = 2) -> str:
    """Format a number for a table ("-" for None)."""
    return "-" if v is None else f"{v:.{digits}f}"


def median(values: list[float]) -> float | None:
    """Median, None when empty."""
    return statistics.median(values) if values else None


def measure_together(
    procs: dict[str, subprocess.Popen[bytes]],
    ports: dict[str, int],
    duration: float,
    scrape_interval: float,
    warmup: float = 3.0,
    tls: bool = False,
) -> dict[str, Measurement]:
    """``measure`` every process of ``procs`` (label -> process, scraped on ``ports[label]``) over the same seconds,
    one scraping thread each, so that a load on the machine falls on all alike; then stop them all (also when a
    measurement raises). Returns label -> Measurement."""
    results: dict[str, Measurement] = {}

    def run(label: str) -> None:
        results[label] = measure(label, procs[label].pid, ports[label], duration, scrape_interval, warmup, tls=tls)

    threads = [threading.Thread(target=run, args=(label,), name=f"measure-{label}") for label in procs]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for p in procs.values():
            stop_exporter(p)
    return results

"""Time every NVML call gpuwarden's poller makes, and the poll itself, on the GPUs of this machine.

``python3 bench/nvml_costs.py [--calls 300] [--polls 100] [--interval 0.1] [--gpu 0] [--json OUT]``

Three parts, all on live NVML (needs a GPU):

1. *isolated*: each call ``gpuwarden.nvml.device.GpuPoller`` makes (and the slow-cadence ones, and each fast field
   value alone), ``--calls`` times back to back: median and p99 in microseconds, as in
   docs/bench/h100-nvml-costs.json. ``nvmlDeviceGetSamples`` is timed both for the whole buffer (timestamp 0)
   and as the poller asks (only samples newer than the last one seen, ``--interval`` apart).
2. *in the poll*: ``GpuPoller.read()`` ``--polls`` times, ``--interval`` apart, with every NVML call timed where the
   poller makes it (a timing ``Caller``): per call median, the sum of the calls per poll, and ``read()`` itself,
   so the Python around the calls (models, psutil, GPM struct) shows as the difference.
3. *the source*: ``NvmlSource.poll()`` (every GPU, host CPU times, process bookkeeping) ``--polls`` times.

Prints tables; ``--json`` writes everything. ``measure_all()`` is what ``bench.run --real`` calls.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: python3 bench/nvml_costs.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pynvml  # noqa: E402

from gpuwarden.nvml.calls import Caller, error_name  # noqa: E402
from gpuwarden.nvml.device import GpuPoller  # noqa: E402
from gpuwarden.nvml.gpm import GPM_IDS, GpmSampler  # noqa: E402
from gpuwarden.nvml.readings import FIELDS, POLL_CALLS, POLL_FIELDS, SLOW_CALLS, SLOW_FIELDS  # noqa: E402
from gpuwarden.nvml.static import read_gpu_static  # noqa: E402
from gpuwarden.procinfo import ProcessInspector, read_host  # noqa: E402

_ECC = {
    "corrected_volatile": (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
    "uncorrected_aggregate": (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
}


def _q(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def stats_us(values: list[float]) -> dict[str, float]:
    """Return {"median_us", "p99_us", "n"} of durations in seconds."""
    return {"median_us": _q(values, 0.5) * 1e6, "p99_us": _q(values, 0.99) * 1e6, "n": len(values)}


def time_call(fn: Callable[[], Any], n: int) -> dict[str, Any]:
    """Call ``fn`` ``n`` times; return its median/p99 wall time (µs), its mean CPU time (µs, this process's
    user + system: kernel work in the driver's ioctl counts, waiting does not) and the NVML error it raised."""
    durations: list[float] = []
    error = None
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        try:
            fn()
        except pynvml.NVMLError as exc:
            error = error_name(exc)
        durations.append(time.perf_counter() - t0)
    cpu_us = (time.process_time() - cpu0) / max(n, 1) * 1e6
    return {**stats_us(durations), "cpu_mean_us": cpu_us, "error": error}


def isolated(h: Any, n: int, interval: float, gpm: bool) -> dict[str, dict[str, Any]]:
    """Time each call of one poll of GPU handle ``h`` in isolation (see the module doc)."""
    out: dict[str, dict[str, Any]] = {}
    calls: list[tuple[str, Callable[[], Any]]] = [
        # the catalogue's declared readings, one NVML call each as the poller makes them
        *[
            (("slow: " if c in SLOW_CALLS else "") + c.name, lambda c=c: c.resolve()(h, *c.args))
            for c in (*POLL_CALLS, *SLOW_CALLS)
        ],
        (
            "nvmlDeviceGetMemoryInfo_v2",
            lambda: pynvml.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2),
        ),
        ("nvmlDeviceGetMemoryInfo", lambda: pynvml.nvmlDeviceGetMemoryInfo(h)),
        (
            f"nvmlDeviceGetFieldValues({len(POLL_FIELDS)} fast fields)",
            lambda: pynvml.nvmlDeviceGetFieldValues(h, POLL_FIELDS),
        ),
        *[
            (f"nvmlDeviceGetFieldValues({FIELDS[f].call})", lambda f=f: pynvml.nvmlDeviceGetFieldValues(h, [f]))
            for f in (*POLL_FIELDS, *SLOW_FIELDS)
        ],
        (
            f"slow: nvmlDeviceGetFieldValues({len(SLOW_FIELDS)} slow fields)",
            lambda: pynvml.nvmlDeviceGetFieldValues(h, SLOW_FIELDS),
        ),
        ("nvmlDeviceGetComputeRunningProcesses", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h)),
        (
            "nvmlDeviceGetSamples(GPU_UTILIZATION, 0) whole buffer",
            lambda: pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0),
        ),
        ("slow: nvmlDeviceGetRemappedRows", lambda: pynvml.nvmlDeviceGetRemappedRows(h)),
        ("host: psutil.cpu_times (read_host)", read_host),
    ]
    for name, fn in calls:
        out[name] = time_call(fn, n)
    # nvmlDeviceGetSamples as the poller asks: only samples newer than the last one seen, `interval` apart
    last = int(time.time() * 1e6)
    durations: list[float] = []
    error = None
    counts: list[int] = []
    for _ in range(max(10, min(n, int(5 / max(interval, 0.01))))):
        time.sleep(interval)
        t0 = time.perf_counter()
        try:
            _, samples = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last)
            counts.append(len(samples))
            if samples:
                last = max(last, max(int(s.timeStamp) for s in samples))
        except pynvml.NVMLError as exc:
            error = error_name(exc)
            counts.append(0)
        durations.append(time.perf_counter() - t0)
    out[f"nvmlDeviceGetSamples(GPU_UTILIZATION, last seen) every {interval:g} s"] = {
        **stats_us(durations),
        "error": error,
        "samples_median": _q([float(c) for c in counts], 0.5),
    }
    if gpm:
        sampler = GpmSampler(h, Caller(Counter()))
        samples = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
        try:
            out["nvmlGpmSampleGet"] = time_call(lambda: pynvml.nvmlGpmSampleGet(h, samples[0]), n)
            pynvml.nvmlGpmSampleGet(h, samples[0])
            time.sleep(0.05)
            pynvml.nvmlGpmSampleGet(h, samples[1])
            req = sampler._request  # the request the poller reuses
            req.sample1, req.sample2 = samples[0], samples[1]
            out[f"nvmlGpmMetricsGet({len(GPM_IDS)} metrics, reused request)"] = time_call(
                lambda: pynvml.nvmlGpmMetricsGet(req), n
            )

            def fresh_request() -> None:
                r = pynvml.c_nvmlGpmMetricsGet_t()
                r.version = pynvml.NVML_GPM_METRICS_GET_VERSION
                r.numMetrics = len(GPM_IDS)
                for i, (mid, _) in enumerate(GPM_IDS.values()):
                    r.metrics[i].metricId = mid
                r.sample1, r.sample2 = samples[0], samples[1]
                pynvml.nvmlGpmMetricsGet(r)

            out[f"nvmlGpmMetricsGet({len(GPM_IDS)} metrics, request built per call)"] = time_call(fresh_request, n)

            # does the cost grow with the number of metrics asked?
            for count in (1, 5):
                r = pynvml.c_nvmlGpmMetricsGet_t()
                r.version = pynvml.NVML_GPM_METRICS_GET_VERSION
                r.numMetrics = count
                for i, (mid, _) in enumerate(list(GPM_IDS.values())[:count]):
                    r.metrics[i].metricId = mid
                r.sample1, r.sample2 = samples[0], samples[1]
                out[f"nvmlGpmMetricsGet({count} metrics, reused request)"] = time_call(
                    lambda r=r: pynvml.nvmlGpmMetricsGet(r), n
                )
        finally:
            for s in samples:
                pynvml.nvmlGpmSampleFree(s)
            sampler.close()
    return out


class TimingCaller(Caller):
    """A Caller that also records how long each named call took (seconds), per call name."""

    def __init__(self, errors: Counter[tuple[str, str]]) -> None:
        super().__init__(errors)
        self.timings: dict[str, list[float]] = defaultdict(list)
        self.poll_sum = 0.0

    def call(self, name: str, fn: Callable[..., Any], *args: Any, quiet: frozenset[int] = frozenset()) -> Any:
        """Caller.call, timed."""
        t0 = time.perf_counter()
        try:
            return super().call(name, fn, *args, quiet=quiet)
        finally:
            dt = time.perf_counter() - t0
            self.timings[name].append(dt)
            self.poll_sum += dt


class TimingInspector(ProcessInspector):
    """A ProcessInspector that records how long each describe() (psutil, /proc) took."""

    def __init__(self) -> None:
        super().__init__()
        self.timings: list[float] = []
        self.poll_sum = 0.0

    def describe(self, pid: int, gpu_memory_bytes: int | None) -> Any:
        """ProcessInspector.describe, timed."""
        t0 = time.perf_counter()
        try:
            return super().describe(pid, gpu_memory_bytes)
        finally:
            dt = time.perf_counter() - t0
            self.timings.append(dt)
            self.poll_sum += dt


def in_poll(handles: dict[int, Any], polls: int, interval: float) -> dict[str, Any]:
    """Run GpuPoller.read() of every GPU ``polls`` times, ``interval`` apart, timing each NVML call inside it."""
    errors: Counter[tuple[str, str]] = Counter()
    inspector = TimingInspector()
    pollers: list[tuple[GpuPoller, TimingCaller]] = []
    for i, h in handles.items():
        caller = TimingCaller(errors)
        static = read_gpu_static(i, h, Caller(errors))
        pollers.append((GpuPoller(static, h, caller, inspector, None, 10.0), caller))
    reads: list[float] = []
    sums: list[float] = []
    psutil_sums: list[float] = []
    try:
        for k in range(polls + 2):
            time.sleep(interval)
            for poller, caller in pollers:
                caller.poll_sum = 0.0
                inspector.poll_sum = 0.0
                t0 = time.perf_counter()
                poller.read(time.time())
                dt = time.perf_counter() - t0
                if k >= 2:  # skip the first reads: GPM needs two samples, slow readings come on the first
                    reads.append(dt)
                    sums.append(caller.poll_sum)
                    psutil_sums.append(inspector.poll_sum)
    finally:
        for poller, _ in pollers:
            poller.close()
    per_call: dict[str, list[float]] = defaultdict(list)
    for _, caller in pollers:
        for name, ts in caller.timings.items():
            per_call[name].extend(ts)
    return {
        "interval_seconds": interval,
        "polls": polls,
        "gpus": len(handles),
        "read_per_gpu": stats_us(reads),
        "nvml_calls_sum_per_gpu": stats_us(sums),
        "psutil_describe_sum_per_gpu": stats_us(psutil_sums),
        "read_over_calls_ratio_median": _q(reads, 0.5) / max(_q(sums, 0.5), 1e-9),
        "per_call": {name: stats_us(ts) for name, ts in sorted(per_call.items())},
        "psutil_describe": stats_us(inspector.timings) if inspector.timings else None,
        "errors": {f"{c}:{e}": n for (c, e), n in errors.items()},
    }


def source_poll(polls: int, interval: float) -> dict[str, Any]:
    """Time NvmlSource.poll() (every GPU, processes, host), ``polls`` times ``interval`` apart."""
    from gpuwarden.nvml.source import NvmlSource

    src = NvmlSource(xid_events=False)
    src.open()
    durations: list[float] = []
    reported: list[float] = []
    try:
        for k in range(polls + 2):
            time.sleep(interval)
            t0 = time.perf_counter()
            p = src.poll()
            dt = time.perf_counter() - t0
            if k >= 2:
                durations.append(dt)
                reported.append(p.duration_seconds)
    finally:
        src.close()
    return {"poll": stats_us(durations), "duration_seconds_reported": stats_us(reported)}


def measure_all(calls: int = 300, polls: int = 100, interval: float = 0.1, gpu: int | None = None) -> dict[str, Any]:
    """Run the three parts (module doc) and return their results; raises pynvml.NVMLError without a GPU.

    Also records this process's resident memory before nvmlInit, after it, and after the polls (``rss_mib``):
    what NVML itself costs the daemon.
    """
    import psutil

    me = psutil.Process()
    rss = {"before_nvml_init": me.memory_info().rss / 1048576.0}
    pynvml.nvmlInit()
    rss["after_nvml_init"] = me.memory_info().rss / 1048576.0
    try:
        count = pynvml.nvmlDeviceGetCount()
        indices = [gpu] if gpu is not None else list(range(count))
        handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices}
        first = indices[0]
        static = read_gpu_static(first, handles[first], Caller(Counter()))
        name = static.name
        iso = isolated(handles[first], calls, interval, static.gpm_supported)
        poll = in_poll(handles, polls, interval)
        rss["after_polls"] = me.memory_info().rss / 1048576.0
        driver = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    src = source_poll(polls, interval)
    return {
        "gpu": name,
        "gpus": len(indices),
        "driver_version": driver.decode() if isinstance(driver, bytes) else driver,
        "calls_per_function": calls,
        "isolated_gpu": first,
        "isolated": iso,
        "in_poll": poll,
        "source": src,
        "rss_mib": rss,
        "poll_calls_sum_ms": poll["nvml_calls_sum_per_gpu"]["median_us"] * len(indices) / 1e3,
        "gpu_poller_read_p50_ms": poll["read_per_gpu"]["median_us"] * len(indices) / 1e3,
    }


def _print(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    t = Table(
        title=f"NVML calls in isolation, GPU {doc['isolated_gpu']} ({doc['gpu']}, driver {doc['driver_version']})"
    )
    for col in ("call", "median µs", "p99 µs", "error"):
        t.add_column(col, justify="left" if col in ("call", "error") else "right")
    for name, r in doc["isolated"].items():
        t.add_row(name, f"{r['median_us']:.1f}", f"{r['p99_us']:.1f}", r.get("error") or "")
    console.print(t)
    p = doc["in_poll"]
    t = Table(title=f"NVML calls inside GpuPoller.read(), {p['polls']} polls {p['interval_seconds']:g} s apart")
    for col in ("call", "median µs", "p99 µs", "n"):
        t.add_column(col, justify="left" if col == "call" else "right")
    for name, r in p["per_call"].items():
        t.add_row(name, f"{r['median_us']:.1f}", f"{r['p99_us']:.1f}", str(r["n"]))
    if p["psutil_describe"]:
        r = p["psutil_describe"]
        t.add_row("psutil ProcessInspector.describe", f"{r['median_us']:.1f}", f"{r['p99_us']:.1f}", str(r["n"]))
    console.print(t)
    r, s = p["read_per_gpu"], p["nvml_calls_sum_per_gpu"]
    console.print(
        f"GpuPoller.read() per GPU: median {r['median_us']:.0f} µs, p99 {r['p99_us']:.0f} µs; sum of its NVML calls: "
        f"median {s['median_us']:.0f} µs (read / calls = {p['read_over_calls_ratio_median']:.2f}); psutil per GPU "
        f"median {p['psutil_describe_sum_per_gpu']['median_us']:.0f} µs"
    )
    console.print(
        "resident memory (MiB): " + ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in doc["rss_mib"].items())
    )
    sp = doc["source"]["poll"]
    console.print(
        f"NvmlSource.poll() ({doc['gpus']} GPU(s)): median {sp['median_us'] / 1e3:.3f} ms, "
        f"p99 {sp['p99_us'] / 1e3:.3f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    """Measure and print; return 0 (1 without a usable NVML)."""
    ap = argparse.ArgumentParser(prog="python3 bench/nvml_costs.py", description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300, help="back-to-back calls per function (isolated part)")
    ap.add_argument("--polls", type=int, default=100, help="polls in the in-poll and source parts")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between polls")
    ap.add_argument("--gpu", type=int, help="only this NVML index (default: all; isolated part on the first)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    try:
        doc = measure_all(args.calls, args.polls, args.interval, args.gpu)
    except pynvml.NVMLError as exc:
        print(f"NVML unavailable: {exc}", file=sys.stderr)
        return 1
    _print(doc)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
